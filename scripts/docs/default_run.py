"""The figures the docs quote about the embedded default run, from one run at a stated commit.

    nice flock /work/bench.lock python -m scripts.docs.default_run    # run it, write docs/figures/default_run.json
    python -m scripts.docs.default_run --update-docs                   # rewrite the docs' quotes from that JSON
    python -m scripts.docs.default_run --check                         # exit 1 when a doc disagrees with it

The run is the README's ``lit-entropy fit --config configs/grpo_tiny.yaml`` as a user types it, in a subprocess
started in a temporary directory, on the code of this checkout; its wall time, the CPU seconds of the process
and the load average of the machine when it started (1, 5, 15 minutes) are kept beside the figures, with the
commit. The figures
are the values :mod:`scripts.docs.run_summary` reads from the run's event files (a step a tag was not logged at
shows the last value before it). Every doc sentence or table row that quotes them is one :class:`Quote` below;
``tests/scripts/test_default_run.py`` checks that each doc holds each quote with the JSON's numbers.

``--steps`` and arguments after ``--`` (extra settings for the run) shorten the run for tests; figures of a
changed run cannot be written into the docs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scripts.docs.run_summary import read_scalars, value_at

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "figures" / "default_run.json"
CONFIG = "configs/grpo_tiny.yaml"
#: Tags whose values the figures keep (the study table's rows and the dashboard's console example).
TAGS = ("val/avg@8", "val/pass@8", "val/pass@2", "train/entropy/mean", "train/reward/mean")
#: Steps of the study table: the starting model, step 60 and the end of the 270-step run.
STEPS = (0, 60, 270)


@dataclass(frozen=True)
class Quote:
    """A passage of ``path`` that quotes the figures: ``template`` with ``{field}`` holes (see :func:`fields`).

    Whitespace in the template matches any run of whitespace in the file (a quote may wrap across lines).
    """

    path: str
    template: str

    def pattern(self) -> re.Pattern[str]:
        """The template as a regular expression with one named group per hole."""
        parts = re.split(r"\{(\w+)\}", self.template)
        regex = ""
        for index, part in enumerate(parts):
            if index % 2:
                regex += f"(?P<{part}>.+?)"
            else:
                regex += r"\s+".join(re.escape(word) for word in part.split(" "))
        return re.compile(regex)


QUOTES = (
    Quote(
        "README.md",
        "The default run took {wall} ({cpu} CPU seconds) on {cpus} CPU cores, started at load {load} (commit "
        "`{commit}`; the time grows with the machine's load): validation accuracy (`val/avg@8`) rises from "
        "{avg_start} to {avg_end} while the token entropy falls from {entropy_start} to {entropy_end} nats,",
    ),
    Quote(
        CONFIG,
        "# (char-level tokenizer). It took {wall} on {cpus} CPU cores, started at load {load} (commit {commit}):",
    ),
    Quote(
        "docs/study.md",
        "the whole run took **{wall}** ({cpu} CPU seconds) on {cpus} CPU cores, started at load {load}, at commit "
        "`{commit}`",
    ),
    Quote("docs/study.md", "| `val/avg@8` | {t_avg_0} | {t_avg_60} | {t_avg_end} (best {t_avg_best}) |"),
    Quote("docs/study.md", "| `val/pass@8` | {t_pass_0} | {t_pass_60} | {t_pass_end} (best {t_pass_best}) |"),
    Quote("docs/study.md", "| `train/entropy/mean` | {t_entropy_0} | {t_entropy_60} | {t_entropy_end} |"),
    Quote("docs/study.md", "| `train/reward/mean` | {t_reward_0} | {t_reward_60} | {t_reward_end} |"),
    Quote("docs/dashboard.md", "(`step {end} | val/avg@8 {t_avg_end} | val/pass@2 {t_pass2_end} | ...`)"),
    Quote("docs/scale.md", "full fine-tuning (`grpo_tiny`, lr 3e-4) ends at {t_avg_end} ([study](study.md))"),
)


def fields(figures: dict[str, Any]) -> dict[str, str]:
    """The text of every hole of :data:`QUOTES`, from the JSON of a run."""
    at = figures["at"]
    steps = [str(step) for step in figures["steps"]]
    start, middle, end = steps[0], steps[len(steps) // 2], steps[-1]

    def two(tag: str, step: str) -> str:
        return f"{at[tag][step]:.2f}"

    def three(tag: str, step: str) -> str:
        return f"{at[tag][step]:.3f}"

    wall = figures["wall_s"]
    text = {
        "wall": f"{wall:.0f} s" if wall < 120 else f"{wall / 60:.1f} min",
        "cpus": str(figures["cpus"]),
        "load": f"{figures['load'][0]:.1f}",
        "cpu": f"{figures['cpu_s']:.0f}",
        "commit": figures["commit"],
        "end": end,
        "avg_start": two("val/avg@8", start),
        "avg_end": two("val/avg@8", end),
        "entropy_start": two("train/entropy/mean", start),
        "entropy_end": two("train/entropy/mean", end),
    }
    for short, tag in (("avg", "val/avg@8"), ("pass", "val/pass@8"), ("pass2", "val/pass@2")):
        text[f"t_{short}_best"] = f"{figures['best'][tag]:.3f}"
    for short, tag in (
        ("avg", "val/avg@8"),
        ("pass", "val/pass@8"),
        ("pass2", "val/pass@2"),
        ("entropy", "train/entropy/mean"),
        ("reward", "train/reward/mean"),
    ):
        text[f"t_{short}_0"], text[f"t_{short}_60"] = three(tag, start), three(tag, middle)
        text[f"t_{short}_end"] = three(tag, end)
    return text


def check_docs(figures: dict[str, Any], root: Path = REPO) -> list[str]:
    """One line per quote that is missing from its file or holds other numbers than ``figures``."""
    values, problems = fields(figures), []
    for quote in QUOTES:
        found = list(quote.pattern().finditer((root / quote.path).read_text()))
        if len(found) != 1:
            problems.append(f"{quote.path}: {len(found)} passages match {quote.template!r} (one expected)")
            continue
        for name, given in found[0].groupdict().items():
            if given != values[name]:
                problems.append(f"{quote.path}: {name} is {given!r}, the figures say {values[name]!r}")
    return problems


def update_docs(figures: dict[str, Any], root: Path = REPO) -> list[str]:
    """Write ``figures`` into every quote (the text around the numbers, line breaks included, stays); the files
    changed."""
    values, changed = fields(figures), []
    for path in dict.fromkeys(quote.path for quote in QUOTES):
        file = root / path
        text = original = file.read_text()
        for quote in (q for q in QUOTES if q.path == path):
            found = list(quote.pattern().finditer(text))
            if len(found) != 1:
                raise ValueError(f"{path}: {len(found)} passages match {quote.template!r} (one expected)")
            match, pieces, last = found[0], [], found[0].start()
            for name in match.groupdict():
                pieces += [text[last : match.start(name)], values[name]]
                last = match.end(name)
            text = text[: match.start()] + "".join(pieces) + text[last:]
        if text != original:
            file.write_text(text)
            changed.append(path)
    return changed


def commit_of(repo: Path) -> str:
    """The short commit of ``repo``'s HEAD, with ``-dirty`` when tracked files differ from it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True, check=True)
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "lit_entropy", "configs"], cwd=repo).returncode
    return head.stdout.strip() + ("-dirty" if dirty else "")


def run_default(workdir: Path, extra: list[str]) -> dict[str, Any]:
    """Run the default in ``workdir`` on this checkout's code; its run directory and what it cost."""
    command = [sys.executable, "-m", "lit_entropy", "fit", "--config", str(REPO / CONFIG), *extra]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    load = list(os.getloadavg())
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    with open(workdir / "run.log", "w") as log:
        done = subprocess.run(command, cwd=workdir, env=env, stdout=log, stderr=subprocess.STDOUT)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        tail = (workdir / "run.log").read_text().splitlines()[-20:]
        raise SystemExit(f"the default run failed (exit {done.returncode}):\n" + "\n".join(tail))
    runs = sorted((workdir / "runs").glob("*/version_*"))
    if len(runs) != 1:
        raise SystemExit(f"expected one run directory under {workdir / 'runs'}, found {runs}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"run_dir": runs[0], "wall_s": wall, "cpu_s": cpu, "load": load}


def figures_of(run: dict[str, Any], steps: list[int], extra: list[str]) -> dict[str, Any]:
    """The JSON of a run: its cost, the commit, and every tag of :data:`TAGS` at ``steps`` (and its best)."""
    scalars = read_scalars(run["run_dir"])
    missing = [tag for tag in TAGS if tag not in scalars]
    if missing:
        raise SystemExit(f"the run logged none of {missing}")
    at = {tag: {str(step): value_at(scalars[tag], step) for step in steps} for tag in TAGS}
    return {
        "command": shlex.join(["lit-entropy", "fit", "--config", CONFIG, *extra]),
        "commit": commit_of(REPO),
        "cpus": os.cpu_count(),
        "load": [round(value, 2) for value in run["load"]],
        "wall_s": round(run["wall_s"], 1),
        "cpu_s": round(run["cpu_s"], 1),
        "steps": steps,
        "at": at,
        "best": {tag: max(value for _, value in scalars[tag]) for tag in TAGS if tag.startswith("val/")},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIGURES, help="the JSON written (default: %(default)s)")
    parser.add_argument("--steps", type=int, nargs="+", default=list(STEPS), help="steps the figures are taken at")
    parser.add_argument("--update-docs", action="store_true", help="rewrite the docs' quotes from --out, no run")
    parser.add_argument("--check", action="store_true", help="exit 1 when a doc disagrees with --out, no run")
    parser.add_argument("extra", nargs="*", help="after --: extra settings for the run (tests only)")
    args = parser.parse_args(argv)
    if args.update_docs or args.check:
        figures = json.loads(args.out.read_text())
        if args.update_docs:
            print("updated: " + (", ".join(update_docs(figures)) or "nothing"))
        problems = check_docs(figures)
        print("\n".join(problems) if problems else f"the docs quote {args.out.name} (commit {figures['commit']})")
        raise SystemExit(1 if problems else 0)
    with tempfile.TemporaryDirectory(prefix="default_run_") as workdir:
        figures = figures_of(run_default(Path(workdir), args.extra), args.steps, args.extra)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(figures, indent=2) + "\n")
    print(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()

"""Word-problem learning runs of SmolLM2-135M-Instruct: GRPO and Clip_B over seeds, validated before and after.

    nice -n 19 python -m scripts.docs.word_problem_runs --out /tmp/wp_runs --steps 2 --seeds 0 1 2 --jobs 1
    python -m scripts.docs.word_problem_runs --out /tmp/wp_runs --collect-only    # tables from finished runs
    nice python -m scripts.docs.word_problem_runs --methods grpo_easy --validate-start once --steps 10 \
        --out /tmp/wp_easy --json docs/figures/word_problem_easy_runs.json       # the easy variant

Each run is ``lit-entropy fit --config configs/smollm2_word_problems{,_clip_b}.yaml`` (the smollm2 extra) sized for
a shared 2-core CPU by :data:`SIZING`: 2 prompts x 8 completions per step, 48-token completions, 16 validation
problems x 4 samples, validation before the first step and after the last one, no checkpoints, one torch thread.
Seeds vary ``seed_everything`` only: the training prompts and the validation problems (``data.seed``) stay the
same, the samples differ. A Clip_B run skips the step-0 validation because it would repeat the GRPO run's of the
same seed (same weights, problems and sampling seed; the clipping callback does not act in validation), so its
"before" is read from that run. ``grpo_easy`` is ``configs/smollm2_word_problems_easy.yaml`` as it is (already sized
for a CPU); with ``--validate-start once`` only the first seed validates the base model and the other seeds read
their "before" from it (the base model is the same; only the sampling seed of its validation would differ).

Writes ``--json`` (default docs/figures/word_problem_runs.json: per run the validation avg@4 / pass@4 before and
after, the wall seconds of every step by phase; the commit, the load averages seen while the runs went), ``--parquet``
(every run's curves as one long table: run, tag, step, value) and prints the Markdown tables docs/performance.md
quotes: per seed, and the mean with a 95 % t interval over seeds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from scripts.docs.default_run import commit_of
from scripts.docs.run_summary import read_scalars, value_at
from scripts.studies.statistics import t_interval

REPO = Path(__file__).resolve().parents[2]
#: Config per method; the first two are identical but for the Clip_B callback.
CONFIGS: dict[str, str] = {
    "grpo": "configs/smollm2_word_problems.yaml",
    "clip_b": "configs/smollm2_word_problems_clip_b.yaml",
    "grpo_easy": "configs/smollm2_word_problems_easy.yaml",
}
#: The method whose run validated the start a method's "before" is read from.
BEFORE_FROM: dict[str, str] = {"grpo": "grpo", "clip_b": "grpo", "grpo_easy": "grpo_easy"}
#: What shrinks the configs' run to what 2 shared CPU cores finish in about an hour (max_steps is added per run).
SIZING: tuple[str, ...] = (
    "--trainer.enable_checkpointing=false",
    "--data.batch_size=2",
    "--data.num_val_examples=16",
    "--data.val_batch_size=16",
    "--model.sampling.max_new_tokens=48",
    "--model.evaluation.max_new_tokens=48",
)
K = 4  # the configs' model.evaluation.num_samples
VAL_TAGS = (f"val/avg@{K}", f"val/pass@{K}")
#: What a method's run adds to its config: the easy config is already sized for a CPU.
SIZINGS: dict[str, tuple[str, ...]] = {
    "grpo": SIZING,
    "clip_b": SIZING,
    "grpo_easy": ("--trainer.enable_checkpointing=false",),
}
PHASES = ("generate", "score", "statistics", "update")
#: The curves ``--parquet`` keeps of every run (prefixes of TensorBoard tags).
KEPT_TAGS = ("val/", "train/reward/", "train/entropy/mean", "train/response_length/", "perf/time_")


def run_command(method: str, seed: int, steps: int, out: Path, *, validate_start: bool | None = None) -> list[str]:
    """The ``lit-entropy fit`` command line of one run (logged under ``out/<method>_s<seed>/version_0``).

    ``validate_start`` (default: whether the run is its own :data:`BEFORE_FROM`) validates the base model first.
    """
    command = [sys.executable, "-m", "lit_entropy", "fit", f"--config={CONFIGS[method]}", f"--seed_everything={seed}"]
    command += [f"--trainer.max_steps={steps}", f"--trainer.val_check_interval={steps}", *SIZINGS[method]]
    command += [f"--trainer.logger.init_args.save_dir={out}", f"--trainer.logger.init_args.name={method}_s{seed}"]
    if not (BEFORE_FROM[method] == method if validate_start is None else validate_start):
        command.append("--val_before_train=false")  # another run validated the same start
    return command


def launch(seeds: list[int], steps: int, out: Path, jobs: int, methods: list[str], once: bool) -> list[str]:
    """Run every (method, seed), ``jobs`` at a time, niced, one torch thread each; returns the load samples.

    ``once``: only the first seed validates the start.
    """
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    pending = [(method, seed) for seed in seeds for method in methods]
    running: list[subprocess.Popen] = []
    loads: list[str] = []
    out.mkdir(parents=True, exist_ok=True)
    while pending or running:
        while pending and len(running) < jobs:
            method, seed = pending.pop(0)
            log = (out / f"{method}_s{seed}.log").open("w")
            first = not once or seed == seeds[0]
            validate = BEFORE_FROM[method] == method and first
            command = ["nice", "-n", "19", *run_command(method, seed, steps, out, validate_start=validate)]
            running.append(subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT))
        time.sleep(60)
        loads.append(time.strftime("%H:%M:%S", time.gmtime()) + " " + Path("/proc/loadavg").read_text().strip())
        for process in [p for p in running if p.poll() is not None]:
            if process.returncode != 0:
                raise SystemExit(f"{' '.join(process.args)} failed with exit code {process.returncode}")
            running.remove(process)
    return loads


def collect(
    out: Path, seeds: list[int], methods: tuple[str, ...] = ("grpo", "clip_b"), once: bool = False
) -> dict[str, Any]:
    """Before/after validation and per-step phase seconds of every run under ``out``.

    A run without a validation after its last step (stopped, killed, still going) is kept as ``unfinished``.
    ``once``: every seed's "before" is the first seed's.
    """
    runs: dict[str, dict[str, Any]] = {}
    for seed in seeds:
        for method in methods:
            start_dir = out / f"{BEFORE_FROM[method]}_s{seeds[0] if once else seed}" / "version_0"
            start = read_scalars(start_dir) if start_dir.exists() else {}
            run_dir = out / f"{method}_s{seed}" / "version_0"
            scalars = read_scalars(run_dir) if run_dir.exists() else {}
            last = max((step for step, _ in scalars.get(VAL_TAGS[0], [])), default=0)
            if last == 0 or value_at(start.get(VAL_TAGS[0], []), 0) is None:  # no validation after training
                runs[f"{method}_s{seed}"] = {"method": method, "seed": seed, "unfinished": True}
                continue
            phases = {name: [v for _, v in scalars.get(f"perf/time_{name}_s", [])] for name in PHASES}
            runs[f"{method}_s{seed}"] = {
                "method": method,
                "seed": seed,
                "steps": last,
                "before": {tag: value_at(start[tag], 0) for tag in VAL_TAGS},
                "after": {tag: value_at(scalars[tag], last) for tag in VAL_TAGS},
                "step_seconds": [round(sum(step), 1) for step in zip(*phases.values(), strict=True)],
                "phase_seconds": {name: [round(v, 1) for v in values] for name, values in phases.items()},
            }
    return runs


def tables(runs: dict[str, dict[str, Any]]) -> str:
    """Markdown: one row per run, then per method the mean with its 95 % t interval over seeds."""
    lines = [
        "| method | seed | steps | avg@4 before | avg@4 after | pass@4 before | pass@4 after | s/step (wall) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in runs.values():
        if run.get("unfinished"):
            lines.append(f"| {run['method']} | {run['seed']} | not finished | | | | | |")
            continue
        before, after = run["before"], run["after"]
        seconds = " / ".join(f"{s:.0f}" for s in run["step_seconds"])
        lines.append(
            f"| {run['method']} | {run['seed']} | {run['steps']} | {before[VAL_TAGS[0]]:.3f} | {after[VAL_TAGS[0]]:.3f}"
            f" | {before[VAL_TAGS[1]]:.3f} | {after[VAL_TAGS[1]]:.3f} | {seconds} |"
        )
    lines += [
        "",
        "| method | tag | runs | before: mean [95 % t interval] | after: mean [95 % t interval] | after - before |",
    ]
    lines.append("|---|---|---|---|---|---|")
    for method in dict.fromkeys(run["method"] for run in runs.values()):
        chosen = [run for run in runs.values() if run["method"] == method and not run.get("unfinished")]
        for tag in VAL_TAGS:
            cells = []
            for when in ("before", "after"):
                interval = t_interval([run[when][tag] for run in chosen])
                cells.append(f"{interval.estimate:.3f} [{interval.low:.3f}, {interval.high:.3f}]")
            change = t_interval([run["after"][tag] - run["before"][tag] for run in chosen])
            cells.append(f"{change.estimate:+.3f} [{change.low:+.3f}, {change.high:+.3f}]")
            lines.append(f"| {method} | `{tag}` | {len(chosen)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def curves(out: Path, runs: dict[str, dict[str, Any]]) -> Any:
    """Every run's :data:`KEPT_TAGS` curves as one ``pandas.DataFrame`` (run, tag, step, value)."""
    import pandas as pd  # deferred: only --parquet needs it

    rows = []
    for name in runs:
        run_dir = out / name / "version_0"
        if not run_dir.exists():
            continue
        for tag, points in read_scalars(run_dir).items():
            if tag.startswith(KEPT_TAGS):
                rows += [{"run": name, "tag": tag, "step": step, "value": value} for step, value in points]
    return pd.DataFrame(rows, columns=["run", "tag", "step", "value"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory of the runs (their logs and event files)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="seed_everything of the runs")
    parser.add_argument("--steps", type=int, default=2, help="training steps per run (validated after the last)")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    parser.add_argument("--methods", nargs="+", choices=list(CONFIGS), default=["grpo", "clip_b"])
    parser.add_argument(
        "--validate-start",
        choices=["per-seed", "once"],
        default="per-seed",
        help="once: only the first seed validates the base model; the others read their 'before' from it",
    )
    parser.add_argument("--collect-only", action="store_true", help="read finished runs under --out, run nothing")
    parser.add_argument("--commit", default=None, help="--collect-only: the commit the runs ran (default: this HEAD)")
    parser.add_argument("--json", type=Path, default=REPO / "docs" / "figures" / "word_problem_runs.json")
    parser.add_argument("--parquet", type=Path, default=None, help="the runs' curves (default: --json as .parquet)")
    args = parser.parse_args(argv)
    commit = args.commit or commit_of(REPO)
    once = args.validate_start == "once"
    sizing = sorted({flag for method in args.methods for flag in SIZINGS[method]})
    figures: dict[str, Any] = {"commit": commit, "configs": [CONFIGS[m] for m in args.methods], "sizing": sizing}
    figures["seeds"] = args.seeds
    if not args.collect_only:
        figures["load"] = launch(args.seeds, args.steps, args.out, args.jobs, args.methods, once)
    elif (args.out / "load.log").exists():  # runs started by hand may keep their load samples there
        figures["load"] = (args.out / "load.log").read_text().splitlines()
    figures["runs"] = collect(args.out, args.seeds, tuple(args.methods), once)
    args.json.write_text(json.dumps(figures, indent=1) + "\n")
    curves(args.out, figures["runs"]).to_parquet(args.parquet or args.json.with_suffix(".parquet"), index=False)
    print(tables(figures["runs"]), end="")


if __name__ == "__main__":
    main()

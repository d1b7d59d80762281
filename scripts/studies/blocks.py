"""Every committed block that is generated from committed results, regenerated in one place.

The study verdicts (``scripts/forking/README.md``, ``docs/study.md``, ``scripts/dynamics_report/report.md``), the
first forking study's tables (``scripts/forking/results/``), the settings reference (``docs/settings.md``) and the
default run's figures quoted in the docs are each written by a generator from committed inputs. :func:`stale`
reruns every generator into a scratch directory and names each block that differs from its committed text;
``tests/scripts/test_generated_blocks.py`` fails on any, and this script prints them:

    python -m scripts.studies.blocks          # exit 1 and one line per stale block (and the command to refresh it)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from scripts.docs import default_run, settings_reference
from scripts.studies.forking import analysis as forking_analysis
from scripts.studies.horizon import analysis as horizon_analysis
from scripts.studies.results import run_names
from scripts.studies.sod import analysis as sod_analysis
from scripts.studies.sod.units import analyze_units

__all__ = ["Block", "blocks", "stale"]

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS_DIR = ROOT / "scripts" / "forking" / "experiments"
FORKING_RESULTS = ROOT / "scripts" / "forking" / "results"


@dataclass(frozen=True)
class Block:
    """One generated block: where it is committed, what it holds there and what its generator writes now."""

    path: Path
    marker: str | None  # None: the whole file is generated
    committed: str
    generated: str
    refresh: str  # the command that rewrites it


def between(text: str, marker: str) -> str:
    """The text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` (``start`` / ``end`` too)."""
    for begin in ("begin", "start"):
        head = f"<!-- {marker}:{begin} -->\n"
        if head in text:
            return text.split(head, 1)[1].split(f"<!-- {marker}:end -->", 1)[0].rstrip()
    raise ValueError(f"no <!-- {marker}:begin --> block found")


def _copy_runs(experiment_dir: Path, scratch: Path) -> Path:
    scratch.mkdir(parents=True)
    if (experiment_dir / "runs.parquet").exists():
        shutil.copy(experiment_dir / "runs.parquet", scratch / "runs.parquet")
    return scratch


def _horizon(scratch: Path) -> Iterator[Block]:
    for experiment in ("horizon", "short"):
        exp = _copy_runs(EXPERIMENTS_DIR / experiment, scratch / experiment)
        horizon_analysis.analyze(exp, experiment=experiment)
        option = "" if experiment == "horizon" else f" --experiment {experiment}"
        for path, marker, kind in horizon_analysis.DOCS[experiment]:
            generated = (exp / ("readme_block.md" if kind == "full" else "docs_block.md")).read_text().rstrip()
            refresh = f"python -m scripts.studies.horizon{option} --analyze --update-readme"
            yield Block(path, marker, between(path.read_text(), marker), generated, refresh)


def _sum_or_difference(scratch: Path) -> Iterator[Block]:
    for experiment, design in sod_analysis.EXPERIMENTS.items():
        source = EXPERIMENTS_DIR / design.directory
        refresh = f"python -m scripts.studies.sod --experiment {experiment} --analyze --update-readme"
        files = [(sod_analysis.README, "readme_block.md")]
        if design.bases:
            files.append((ROOT / "docs" / "study.md", "docs_block.md"))
        if not run_names(source) and not design.bases:  # a units analysis writes its n = 0 block itself
            for path, _ in files:
                yield Block(
                    path, design.marker, between(path.read_text(), design.marker), "(no runs analysed yet)", refresh
                )
            continue
        exp = _copy_runs(source, scratch / experiment)
        if design.bases:  # (base, seed) units and issue 39's rule
            analyze_units(exp, design, experiment)
        else:
            sod_analysis.analyze(exp, experiment=experiment)
        for path, name in files:
            generated = (exp / name).read_text().rstrip()
            yield Block(path, design.marker, between(path.read_text(), design.marker), generated, refresh)


def _first_forking_study(scratch: Path) -> Iterator[Block]:
    out = scratch / "forking"
    out.mkdir(parents=True)
    for name in ("eval.parquet", "train.parquet", "run_seconds.json"):
        shutil.copy(FORKING_RESULTS / name, out / name)
    forking_analysis.analyze(out, plots=False)
    refresh = "python -m scripts.studies.forking --analyze --out scripts/forking/results"
    for name in ("readme_table.md", "summary.md"):
        committed = (FORKING_RESULTS / name).read_text()
        yield Block(FORKING_RESULTS / name, None, committed, (out / name).read_text(), refresh)


def _docs() -> Iterator[Block]:
    refresh = "python -m scripts.docs.settings_reference --update"
    yield Block(settings_reference.DOC, settings_reference.MARKER, settings_reference.read_block(),
                settings_reference.block(), refresh)  # fmt: skip
    figures = json.loads(default_run.FIGURES.read_text())
    problems = default_run.check_docs(figures)
    refresh = "python -m scripts.docs.default_run --update-docs"
    yield Block(default_run.FIGURES, "quoted figures", "\n".join(problems), "", refresh)


def blocks(scratch: Path) -> Iterator[Block]:
    """Every generated block, regenerated with ``scratch`` as the generators' output directory."""
    yield from _horizon(scratch)
    yield from _sum_or_difference(scratch)
    yield from _first_forking_study(scratch)
    yield from _docs()


def stale(scratch: Path) -> list[str]:
    """One line per block whose committed text differs from what its generator writes now."""
    return [
        f"{block.path.relative_to(ROOT)} ({block.marker or 'whole file'}) is stale: {block.refresh}"
        for block in blocks(scratch)
        if block.committed != block.generated
    ]


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        lines = stale(Path(tmp))
    print("\n".join(lines) or "every generated block matches its committed text")
    sys.exit(1 if lines else 0)


if __name__ == "__main__":
    main()

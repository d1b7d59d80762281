"""What every study's analysis shares, whatever its task and endpoint.

A study's runs are keyed ``(base, arm, seed)`` (base None in a one-base experiment, whose runs are named
``<arm>__s<seed>``); :func:`load_runs` reads them from the experiment's table and refuses runs of more than one code
revision. Each analysis then computes its task's endpoint per run and judges the pre-registered comparisons with
:func:`judge` (experiments A, B, C and C's amendment: :func:`verdict`) or with issue 39's corrected rule
(``scripts/studies/sod/multiplicity.py``). The per-run record (:func:`run_record`), the arm means
(:func:`mean_row`), the provenance of the runs (:func:`provenance`) and the way a generated block replaces its
committed text (:func:`replace_block`) are the same for all of them; ``scripts/studies/report.py`` formats them.
"""

from __future__ import annotations

import math
from pathlib import Path
from statistics import fmean
from typing import Any

from scripts.studies.results import collect
from scripts.studies.results import load_runs as load_table
from scripts.studies.statistics import paired_t_interval, sign_flip_test

__all__ = [
    "DELTA",
    "judge",
    "load_runs",
    "mean_row",
    "provenance",
    "replace_block",
    "run_key",
    "run_record",
    "verdict",
]

#: Effect-size floor of the pre-registered verdict rules (pass@64 / avg@64 points, as fractions).
DELTA = 0.02

Key = tuple[str | None, str, int]  # (base, arm, seed)


def run_key(name: str) -> Key:
    """``(base, arm, seed)`` of a run name ``<base>__<arm>__s<seed>`` (``<arm>__s<seed>``: base None)."""
    *base, arm, seed = name.split("__")
    return (base[0] if base else None, arm, int(seed.removeprefix("s")))


def load_runs(exp: Path) -> dict[Key, dict[str, Any]]:
    """``{(base, arm, seed): {"eval": rows, "train": rows, "done": dict}}`` of every finished run (those finished
    since, in ``per_run/``, join the table first); refuses runs of more than one code revision."""
    collect(exp)
    runs = {run_key(name): run for name, run in load_table(exp).items()}
    revisions = sorted({r["done"]["code_revision"] for r in runs.values()})
    if len(revisions) > 1:
        raise ValueError(f"runs of one experiment must share a code revision, found {revisions}")
    return runs


def provenance(runs: dict[Key, dict[str, Any]]) -> dict[str, Any]:
    """The runs' code revision, torch versions and total run-minutes."""
    done = [r["done"] for r in runs.values()]
    return {
        "code_revision": done[0]["code_revision"] if done else None,
        "torch": sorted({d["torch"] for d in done}),
        "run_minutes_total": round(sum(d["seconds"] for d in done) / 60, 1),
    }


def run_record(run: dict[str, Any]) -> dict[str, Any]:
    """A run's seconds and, for a replayed-count control, its shortfall and the share of the replayed Clip_B count
    that found A < 0 tokens to mask."""
    out = {"seconds": run["done"]["seconds"], "replay_shortfall": run["done"].get("replay_shortfall")}
    if out["replay_shortfall"] is not None:
        masked = sum(int(r["masked_n_strategy"]) + int(r["masked_n_exec"]) for r in run["train"])
        out["replay_matched_share"] = masked / max(masked + out["replay_shortfall"], 1)
    return out


def mean_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The number of ``rows`` and the mean of each of their float columns."""
    keys = [k for k in rows[0] if isinstance(rows[0][k], float)]
    return {"n": len(rows), **{k: fmean(r[k] for r in rows) for k in keys}}


def verdict(low: float, high: float, mean: float, p: float, delta: float = DELTA) -> str:
    """The pre-registered rule of experiments A, B and C: better/worse, none, or inconclusive."""
    if any(math.isnan(x) for x in (low, high, mean)):
        return "inconclusive"
    excludes_zero = low > 0 or high < 0
    if excludes_zero and abs(mean) >= delta and p < 0.05:
        return "better" if mean > 0 else "worse"
    if (-delta <= low and high <= delta) or (excludes_zero and abs(mean) < delta):
        return "none"
    return "inconclusive"


def judge(x: list[float], y: list[float]) -> dict[str, Any]:
    """One pre-registered comparison of paired values (treated ``x``, control ``y``, one per unit): the mean
    difference, its 95 % paired t interval, the exact sign-flip p-value, the units above 0, and the verdict."""
    diffs = [a - b for a, b in zip(x, y, strict=True)]
    interval = paired_t_interval(x, y)
    p = sign_flip_test(diffs)
    return {
        "mean": interval.estimate,
        "low": interval.low,
        "high": interval.high,
        "p_sign_flip": p,
        "positive": sum(d > 0 for d in diffs),
        "diffs": diffs,
        "verdict": verdict(interval.low, interval.high, interval.estimate, p),
    }


def replace_block(path: Path, marker: str, block: str) -> bool:
    """Replace the text between ``<!-- marker:begin -->`` and ``<!-- marker:end -->``; True if it changed."""
    text = path.read_text()
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    if begin not in text or end not in text:
        raise ValueError(f"{path} has no {begin} ... {end} markers")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    new = f"{head}{begin}\n{block.rstrip()}\n{end}{tail}"
    if new != text:
        path.write_text(new)
    return new != text

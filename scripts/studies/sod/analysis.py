"""Analysis of the sum-or-difference forking study (``scripts/studies/sod/run.py``), by the pre-registered rule.

Reads only the committed per-run results (``<exp>/per_run/<run>/{eval,train}.csv`` and ``done.json``) and writes
``<exp>/summary.json`` (every number quoted), ``<exp>/summary.md`` (the tables), ``<exp>/pass_at_64.png`` and
``<exp>/readme_block.md``; ``--update-readme`` copies the block into ``scripts/forking/README.md`` between its markers.

    python -m scripts.studies.sod --analyze --update-readme
    python -m scripts.studies.sod --experiment sod_clipv --analyze --update-readme

The arms, run order, comparisons and README marker of each experiment come from ``scripts/studies/sod/design.py``.
An experiment on several base models (``sod_robust``) is analysed by ``scripts/studies/sod/units.py``.

Endpoint (``PREREGISTRATION.md``): per run, the mean over its last 3 evaluations of the test-prompt mean of
pass@64 = 1 - (1 - p)^64 and of avg@64 = p. Per comparison: the per-seed paired differences, their 95 % Student-t
interval and the exact two-sided sign-flip p-value; verdict with the effect-size floor ``DELTA``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean
from typing import Any

from scripts.studies.analysis import judge, mean_row, provenance, replace_block, run_record
from scripts.studies.analysis import load_runs as load_keyed_runs
from scripts.studies.sod.design import EXPERIMENTS, LABELS

ROOT = Path(__file__).resolve().parents[3]
README = ROOT / "scripts" / "forking" / "README.md"
K = 64
LAST_EVALS = 3
METRICS = ("pass@64", "avg@64")


def load_runs(exp: Path) -> dict[tuple[str, int], dict[str, Any]]:
    """``{(arm, seed): {"eval": rows, "train": rows, "done": dict}}`` of every finished run
    (:func:`scripts.studies.analysis.load_runs` of a one-base experiment)."""
    return {(arm, seed): run for (_, arm, seed), run in load_keyed_runs(exp).items()}


def _p(row: dict[str, str]) -> float:
    return math.exp(float(row["logp"]))


def endpoint(eval_rows: list[dict[str, str]], cls: str | None = None) -> dict[str, float]:
    """Mean over the last ``LAST_EVALS`` evaluations of the prompt-mean pass@64, avg@64 and P(R) (T = 1.0)."""
    rows = [r for r in eval_rows if float(r["temperature"]) == 1.0 and (cls is None or r["class"] == cls)]
    steps = sorted({int(r["step"]) for r in rows})[-LAST_EVALS:]
    out: dict[str, list[float]] = {"pass@64": [], "avg@64": [], "p_R": []}
    for step in steps:
        at = [r for r in rows if int(r["step"]) == step]
        out["pass@64"].append(fmean(1.0 - (1.0 - min(_p(r), 1.0)) ** K for r in at))
        out["avg@64"].append(fmean(_p(r) for r in at))
        out["p_R"].append(fmean(math.exp(float(r["logp_R"])) for r in at))
    return {k: fmean(v) for k, v in out.items()}


def curve(eval_rows: list[dict[str, str]]) -> dict[int, float]:
    """Test pass@64 at every evaluated step."""
    steps: dict[int, list[float]] = {}
    for r in eval_rows:
        steps.setdefault(int(r["step"]), []).append(1.0 - (1.0 - min(_p(r), 1.0)) ** K)
    return {s: fmean(v) for s, v in sorted(steps.items())}


def train_summary(train_rows: list[dict[str, str]]) -> dict[str, float]:
    """Mean per-step entropy and masked count by role over the whole run and over its last quarter."""
    out = {}
    tail = train_rows[-max(1, len(train_rows) // 4) :]
    for role in ("strategy", "exec"):
        out[f"entropy_{role}"] = fmean(float(r[f"entropy_{role}"]) for r in train_rows)
        out[f"entropy_{role}_last_quarter"] = fmean(float(r[f"entropy_{role}"]) for r in tail)
        out[f"masked_per_step_{role}"] = fmean(int(r[f"masked_n_{role}"]) for r in train_rows)
    out["reward_last_quarter"] = fmean(float(r["reward_mean"]) for r in tail)
    return out


def per_run_table(runs: dict[tuple[str, int], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table = {}
    for (arm, seed), run in sorted(runs.items()):
        row = {"arm": arm, "seed": seed, **endpoint(run["eval"])}
        for cls in ("sum", "diff"):
            row.update({f"{k}_{cls}": v for k, v in endpoint(run["eval"], cls).items()})
        row.update(train_summary(run["train"]))
        row.update(run_record(run))
        table[f"{arm}__s{seed}"] = row
    return table


def compare(table: dict[str, dict[str, Any]], treated: str, control: str, seeds: list[int]) -> dict[str, Any]:
    out: dict[str, Any] = {"treated": treated, "control": control, "seeds": seeds}
    for metric in METRICS:
        x = [table[f"{treated}__s{s}"][metric] for s in seeds]
        out[metric] = judge(x, [table[f"{control}__s{s}"][metric] for s in seeds])
    return out


def comparable_seeds(table: dict[str, dict[str, Any]], arms: tuple[str, ...]) -> list[int]:
    seeds = [{r["seed"] for r in table.values() if r["arm"] == a} for a in arms]
    return sorted(set.intersection(*seeds)) if seeds else []


def analyze(exp: Path, update_readme: bool = False, experiment: str = "sod") -> dict[str, Any]:
    """Experiment ``experiment``'s runs in ``exp`` by C's rule; an experiment on several base models goes to
    :func:`scripts.studies.sod.units.analyze_units` (``run.py`` picks)."""
    design = EXPERIMENTS[experiment]
    if design.bases:
        raise ValueError(f"{experiment} has (base, seed) units: scripts.studies.sod.units.analyze_units judges it")
    runs = load_runs(exp)
    table = per_run_table(runs)
    first_seeds = comparable_seeds(table, design.first)
    comparisons = []
    for treated, control in design.comparisons:
        both = (treated, control)
        seeds = first_seeds if set(both) <= set(design.first) else comparable_seeds(table, both)
        if len(seeds) >= 2:
            comparisons.append(compare(table, treated, control, seeds))
    arms = sorted({r["arm"] for r in table.values()}, key=lambda a: list(LABELS).index(a))
    means = {}
    for arm in arms:
        means[arm] = mean_row([r for r in table.values() if r["arm"] == arm])
    base = endpoint([r for r in next(iter(runs.values()))["eval"] if r["step"] == "0"]) if runs else {}
    curves = {f"{a}__s{s}": curve(r["eval"]) for (a, s), r in sorted(runs.items())}
    summary = {
        "experiment": experiment,
        "planned_runs": design.planned_runs,
        "directory": design.directory,
        **provenance(runs),
        "base_model": base,
        "arm_means": means,
        "comparisons": comparisons,
        "per_run": table,
        "pass64_curves": curves,
    }
    (exp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    from scripts.studies.sod.report import plot, readme_block, summary_tables

    (exp / "summary.md").write_text(summary_tables(summary))
    plot(summary, exp / "pass_at_64.png")
    block = readme_block(summary)
    (exp / "readme_block.md").write_text(block)
    if update_readme:
        changed = replace_block(README, design.marker, block)
        print(f"[forking_sod] {README.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}", flush=True)
    print(block, flush=True)
    return summary

"""Analysis of the horizon forking study (``scripts/studies/horizon/run.py``), by the pre-registered rule.

Reads only the per-run results (``<exp>/per_run/<base>__<arm>__s<seed>/{eval,train}.csv`` and ``done.json``) and
writes ``<exp>/summary.json`` (every number quoted), ``<exp>/summary.md``, ``<exp>/pass_at_64.png`` and
``<exp>/readme_block.md`` / ``docs_block.md``; ``--update-readme`` copies the blocks between the experiment's
markers in ``DOCS``.

    python -m scripts.studies.horizon --analyze --update-readme                      # experiment A
    python -m scripts.studies.horizon --experiment short --analyze --update-readme   # experiment B

Endpoint (``experiments/<experiment>/PREREGISTRATION.md``): per run, the mean over its last 3 evaluations of the
class-weighted (``CLASS_PROBS``) test mean of pass@64 = 1 - (1 - p)^64 and of avg@64 = p. Per comparison: the
differences over (base, seed) units, their 95 % paired Student-t interval and the exact two-sided sign-flip
p-value, pooled over both bases (primary) and per base; verdict with the effect-size floor of experiment C.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from statistics import fmean
from typing import Any

from scripts.studies.analysis import judge, load_runs, mean_row, provenance, replace_block, run_record
from scripts.studies.sod.analysis import train_summary
from scripts.studies.tasks.forking import CLASS_PROBS, STRATEGIES

ROOT = Path(__file__).resolve().parents[3]
#: Experiment -> the files that carry its generated block, their marker names, and the block ("full": every table;
#: "docs": status, pooled verdicts and the arm table).
DOCS = {
    "horizon": (
        (ROOT / "scripts" / "forking" / "README.md", "horizon-results", "full"),
        (ROOT / "docs" / "study.md", "horizon-results", "docs"),
        (ROOT / "scripts" / "dynamics_report" / "report.md", "report-horizon", "docs"),
    ),
    "short": (
        (ROOT / "scripts" / "forking" / "README.md", "short-results", "full"),
        (ROOT / "docs" / "study.md", "short-results", "docs"),
        (ROOT / "scripts" / "dynamics_report" / "report.md", "report-short", "docs"),
    ),
}
K = 64
LAST_EVALS = 3
WEIGHTS = dict(zip(STRATEGIES, CLASS_PROBS, strict=True))
PRIMARY = ("grpo", "clip_b", "replay_mask")
ARM_ORDER = (*PRIMARY, "grpo_null")
#: (treated, control) pairs judged by the rule, in the pre-registered order.
COMPARISONS = (("clip_b", "grpo"), ("replay_mask", "grpo"), ("clip_b", "replay_mask"), ("grpo_null", "grpo"))
METRICS = ("pass@64", "avg@64")
Unit = tuple[str, int]  # (base, seed)


def at_step(rows: list[dict[str, str]]) -> dict[str, float]:
    """Class-weighted pass@64 and avg@64 of one evaluation, and per class: pass@64, P(first token right) and
    p(correct | first token right)."""
    out: dict[str, float] = {"pass@64": 0.0, "avg@64": 0.0}
    for cls, w in WEIGHTS.items():
        mine = [r for r in rows if r["class"] == cls]
        p = [min(math.exp(float(r["logp"])), 1.0) for r in mine]
        first = [math.exp(float(r["logp_first"])) for r in mine]
        out[f"pass@64_{cls}"] = fmean(1.0 - (1.0 - q) ** K for q in p)
        out[f"p_first_{cls}"] = fmean(first)
        out[f"exec_given_first_{cls}"] = fmean(math.exp(float(r["logp"]) - float(r["logp_first"])) for r in mine)
        out["pass@64"] += w * out[f"pass@64_{cls}"]
        out["avg@64"] += w * fmean(p)
    return out


def endpoint(eval_rows: list[dict[str, str]]) -> dict[str, float]:
    """Mean over the last ``LAST_EVALS`` evaluations (T = 1.0) of :func:`at_step`'s numbers."""
    rows = [r for r in eval_rows if float(r["temperature"]) == 1.0]
    steps = sorted({int(r["step"]) for r in rows})[-LAST_EVALS:]
    each = [at_step([r for r in rows if int(r["step"]) == s]) for s in steps]
    return {k: fmean(e[k] for e in each) for k in each[0]}


def curve(eval_rows: list[dict[str, str]]) -> dict[int, float]:
    """Class-weighted test pass@64 at every evaluated step (T = 1.0)."""
    steps = sorted({int(r["step"]) for r in eval_rows})
    return {s: at_step([r for r in eval_rows if int(r["step"]) == s])["pass@64"] for s in steps}


def per_run_table(runs: dict[tuple[str, str, int], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    table = {}
    for (base, arm, seed), run in sorted(runs.items()):
        row = {"base": base, "arm": arm, "seed": seed, **endpoint(run["eval"]), **train_summary(run["train"])}
        row.update(run_record(run))
        table[f"{base}__{arm}__s{seed}"] = row
    return table


def units_with(table: dict[str, dict[str, Any]], arms: tuple[str, ...], base: str | None = None) -> list[Unit]:
    """The (base, seed) units where every arm of ``arms`` finished (on ``base`` only, when given)."""
    have = [{(r["base"], r["seed"]) for r in table.values() if r["arm"] == a} for a in arms]
    units = set.intersection(*have) if have else set()
    return sorted(u for u in units if base is None or u[0] == base)


def compare(table: dict[str, dict[str, Any]], treated: str, control: str, units: list[Unit]) -> dict[str, Any]:
    out: dict[str, Any] = {"treated": treated, "control": control, "units": [list(u) for u in units]}
    for metric in METRICS:
        x = [table[f"{b}__{treated}__s{s}"][metric] for b, s in units]
        out[metric] = judge(x, [table[f"{b}__{control}__s{s}"][metric] for b, s in units])
    return out


def comparisons(table: dict[str, dict[str, Any]], bases: list[str]) -> list[dict[str, Any]]:
    """Every pre-registered comparison with at least 2 units: pooled (``scope`` "pooled") then per base."""
    out = []
    for scope in ["pooled", *bases]:
        base = None if scope == "pooled" else scope
        for treated, control in COMPARISONS:
            arms = PRIMARY if {treated, control} <= set(PRIMARY) else (treated, control)
            units = units_with(table, arms, base)
            if len(units) >= 2:
                out.append({"scope": scope, **compare(table, treated, control, units)})
    return out


def analyze(exp: Path, update_readme: bool = False, experiment: str = "horizon") -> dict[str, Any]:
    runs = load_runs(exp)
    table = per_run_table(runs)
    bases = sorted({r["base"] for r in table.values()})
    means: dict[str, dict[str, Any]] = {}
    for base in bases:
        for arm in sorted({r["arm"] for r in table.values() if r["base"] == base}, key=ARM_ORDER.index):
            rows = [r for r in table.values() if r["base"] == base and r["arm"] == arm]
            means[f"{base}__{arm}"] = {"base": base, "arm": arm, **mean_row(rows)}
    start = {}
    for (base, _, _), run in sorted(runs.items()):
        start.setdefault(base, at_step([r for r in run["eval"] if r["step"] == "0"]))
    first = next(iter(runs.values()))["eval"] if runs else []
    summary = {
        "experiment": experiment,
        "endpoint_steps": sorted({int(r["step"]) for r in first})[-LAST_EVALS:],
        **provenance(runs),
        "n_runs": len(runs),
        "base_models": start,
        "arm_means": means,
        "comparisons": comparisons(table, bases),
        "per_run": table,
        "pass64_curves": {f"{b}__{a}__s{s}": curve(r["eval"]) for (b, a, s), r in sorted(runs.items())},
    }
    (exp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    from scripts.studies.horizon.report import docs_block, plot, readme_block, summary_tables

    (exp / "summary.md").write_text(summary_tables(summary))
    if runs:
        plot(summary, exp / "pass_at_64.png")
    block = readme_block(summary)
    (exp / "readme_block.md").write_text(block)
    (exp / "docs_block.md").write_text(docs_block(summary))
    if update_readme:
        for path, marker, kind in DOCS[experiment]:
            changed = replace_block(path, marker, block if kind == "full" else docs_block(summary))
            print(f"[forking_horizon] {path.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}", flush=True)
    print(block, flush=True)
    return summary

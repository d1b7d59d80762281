"""Experiments A, B, C and C's Clip_V amendment read again under issue 39's decision rule.

Their pre-registered rule called a comparison "none" also when its 95 % interval excluded 0 with a mean below the
floor, and applied no correction for multiplicity. Issue 39's rule (``scripts/studies/sod/multiplicity.py``, as E
and F pre-register it) calls "none" only an interval inside +-delta, "small, consistent" an interval that excludes
0 with p < 0.05 and a mean below the floor, and corrects each family by Holm with Bonferroni intervals. This
prints, for every pooled comparison of the four finished experiments, the verdict each way, from the committed
``summary.json`` (the per-unit differences the generated blocks judge):

    python -m scripts.studies.reread

Columns: the pre-registered verdict; issue 39's rule without correction (95 % t interval, raw sign-flip p); and
with Holm over the experiment's whole pooled family (every pooled comparison on both metrics, e.g. C's 12 tests),
each interval at the family's Bonferroni level. The pre-registered verdicts stand as the experiments' verdicts;
this is a reading aid, not a re-analysis chosen after the fact.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from scripts.studies.sod.design import DELTA
from scripts.studies.sod.multiplicity import corrected_verdict, family_level, holm, sign_flip_p
from scripts.studies.statistics import t_interval

__all__ = ["pooled_tests", "reread", "table"]

ROOT = Path(__file__).resolve().parents[2]
EXPERIMENTS = {
    "horizon": "A (horizon)",
    "short": "B (short executions)",
    "sod": "C (sum-or-difference)",
    "sod_clipv": "C's Clip_V amendment",
}
METRICS = ("pass@64", "avg@64")


def pooled_tests(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """Every pooled comparison x metric of a ``summary.json``: treated, control, metric, diffs, old verdict."""
    tests = []
    for c in summary["comparisons"]:
        if c.get("scope", "pooled") != "pooled":  # A and B also judge each base; C has one base
            continue
        for metric in METRICS:
            j = c[metric]
            tests.append(
                {
                    "treated": c["treated"],
                    "control": c["control"],
                    "metric": metric,
                    "diffs": j["diffs"],
                    "old": j["verdict"],
                }
            )
    return tests


def reread(summary: dict[str, Any], delta: float = DELTA) -> list[dict[str, Any]]:
    """The tests of :func:`pooled_tests` with issue 39's verdict uncorrected and under Holm over all of them."""
    tests = pooled_tests(summary)
    p = [sign_flip_p(t["diffs"]) for t in tests]
    p_holm = holm(p)
    level = family_level(len(tests))
    for t, p_raw, p_adj in zip(tests, p, p_holm, strict=True):
        i95 = t_interval(t["diffs"], 0.95)
        fam = t_interval(t["diffs"], level)
        t.update(
            mean=i95.estimate,
            low95=i95.low,
            high95=i95.high,
            p=p_raw,
            low=fam.low,
            high=fam.high,
            level=level,
            p_holm=p_adj,
            positive=sum(d > 0 for d in t["diffs"]),
            n=len(t["diffs"]),
            new=corrected_verdict(i95.low, i95.high, i95.estimate, p_raw, delta),
            holm=corrected_verdict(fam.low, fam.high, fam.estimate, p_adj, delta),
        )
    return tests


def table(experiments: dict[str, str] = EXPERIMENTS) -> str:
    """A markdown table over ``experiments`` (directory -> label); rows where a verdict changes are marked."""
    rows = [
        "| experiment | comparison | metric | n | mean | 95 % interval | p | units > 0 | pre-registered | "
        "issue 39, uncorrected | family interval | Holm p | issue 39, Holm over the family |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for directory, label in experiments.items():
        summary = json.loads((ROOT / "scripts" / "forking" / "experiments" / directory / "summary.json").read_text())
        tests = reread(summary)
        for t in tests:
            mark = " *" if t["new"] != t["old"] else ""
            rows.append(
                f"| {label} (m = {len(tests)}) | {t['treated']} - {t['control']} | {t['metric']} | {t['n']} | "
                f"{t['mean']:+.3f} | [{t['low95']:+.3f}, {t['high95']:+.3f}] | {t['p']:.4f} | "
                f"{t['positive']}/{t['n']} | {t['old']} | {t['new']}{mark} | [{t['low']:+.3f}, {t['high']:+.3f}] "
                f"({t['level']:.2%}) | {t['p_holm']:.4f} | {t['holm']} |"
            )
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.parse_args(argv)
    print(table(), end="")


if __name__ == "__main__":
    main()

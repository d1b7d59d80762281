"""What every study's generated blocks share: number format, tables, the verdict phrases and the paper's figures.

Formats an analysis's ``summary.json`` content; computes nothing. Each study's ``report.py`` lays out its own
tables (its task's columns) from these pieces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from scripts.studies.analysis import DELTA

__all__ = [
    "PAPER",
    "RULE",
    "judged_cells",
    "markdown_table",
    "number",
    "per_base_rows",
    "plot_runs",
    "save_figure",
    "verdict_text",
]

PAPER = (
    "paper (arXiv 2602.03392, Qwen2.5-7B, AIME24, one run per method): GRPO -> Clip_B Pass@32 50.00 -> 56.67 "
    "(+6.67 points), Avg@32 16.88 -> 19.69 (+2.81 points); no seeds, no interval"
)
#: The rule of experiments A, B and C (:func:`scripts.studies.analysis.verdict`) in words.
RULE = (
    f"better/worse: 95 % paired t interval excludes 0, |mean| >= {DELTA} and exact sign-flip p < 0.05; none: "
    f"interval inside +-{DELTA} (or excludes 0 with |mean| < {DELTA}); otherwise inconclusive"
)


def number(x: float | None, digits: int = 3) -> str:
    """``x`` to ``digits`` places, with its sign only when negative; ``-`` for None."""
    return "-" if x is None else f"{x:+.{digits}f}" if x < 0 else f"{x:.{digits}f}"


def markdown_table(header: str, rows: Iterable[str]) -> str:
    """A Markdown table: ``header`` (``| a | b |``), its ``| --- |`` rule, then ``rows``, each ending in a newline."""
    rule = "|" + " --- |" * (header.count("|") - 1)
    return "\n".join([header, rule, *rows]) + "\n"


def judged_cells(r: dict[str, Any], n: int) -> str:
    """The table cells of one judged comparison over ``n`` units (:func:`scripts.studies.analysis.judge`): mean,
    95 % interval, sign-flip p, units above 0 and the verdict."""
    return (
        f"{number(r['mean'])} | [{number(r['low'])}, {number(r['high'])}] | {r['p_sign_flip']:.3f} | "
        f"{r['positive']}/{n} | **{r['verdict']}** |"
    )


def verdict_text(c: dict[str, Any], comma: str = ", ") -> str:
    """``pass@64 **verdict** (mean, [low, high], p = ...); avg@64 ...`` of one judged comparison (``comma``: what
    separates the mean from its interval)."""
    return "; ".join(
        f"{metric} **{r['verdict']}** ({number(r['mean'])}{comma}[{number(r['low'])}, {number(r['high'])}], "
        f"p = {r['p_sign_flip']:.3f})"
        for metric, r in ((m, c[m]) for m in ("pass@64", "avg@64"))
    )


def per_base_rows(
    summary: dict[str, Any], base_rows: Callable[[str, dict[str, Any]], list[str]], arm_row: Callable[[dict], str]
) -> list[str]:
    """Table rows base by base: ``base_rows(base, its step-0 numbers)``, then ``arm_row`` of each of its arm means."""
    rows = []
    for base, step0 in summary["base_models"].items():
        rows += base_rows(base, step0)
        rows += [arm_row(m) for m in summary["arm_means"].values() if m["base"] == base]
    return rows


def plot_runs(ax: Any, curves: list[dict[Any, float]], colour: str, label: str) -> None:
    """Every run's test curve (thin) and their mean over the steps all of them evaluated (thick) on ``ax``."""
    for c in curves:
        ax.plot([int(s) for s in c], list(c.values()), color=colour, lw=0.5, alpha=0.5)
    steps = sorted(set.intersection(*({int(s) for s in c} for c in curves)))
    mean = [sum(c.get(s, c.get(str(s), 0.0)) for c in curves) / len(curves) for s in steps]
    ax.plot(steps, mean, color=colour, lw=2, label=f"{label} (n={len(curves)})")


def save_figure(fig: Any, path: Any) -> None:
    """Write ``fig`` to ``path`` (110 dpi) and close it."""
    import matplotlib.pyplot as plt  # reason: matplotlib loads only for a figure

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

"""Markdown of the horizon forking study: the summary tables and the generated block.

Formats ``summary.json``'s content (``scripts/forking_horizon_analysis.py``); computes nothing new except counts.
"""

from __future__ import annotations

from typing import Any

from forking_sod_report import PAPER, RULE, _f

from lit_entropy.data.forking import CLASS_PROBS

LABELS = {
    "grpo": "GRPO",
    "clip_b": "Clip_B mu 2.5",
    "replay_mask": "random mask, Clip_B's per-step count replayed",
    "grpo_null": "GRPO, other data order (null)",
}
PRIMARY_RUNS = 30  # 3 arms x 2 bases x 5 seeds (PREREGISTRATION.md)
MINORITY = ("B", "C", "D")


def arm_table(summary: dict[str, Any]) -> str:
    head = " / ".join(MINORITY)
    lines = [
        f"| base | arm | seeds | pass@64 | avg@64 | pass@64 {head} | P(right strategy) {head} | "
        "p(correct execution given the right strategy) B | entropy strategy / exec (last quarter, nats) | "
        "masked tokens per step strategy / exec |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for base, m in summary["base_models"].items():
        lines.append(
            f"| {base} | base model (step 0) | - | {_f(m['pass@64'])} | {_f(m['avg@64'])} | "
            + " / ".join(_f(m[f"pass@64_{c}"]) for c in MINORITY)
            + " | "
            + " / ".join(_f(m[f"p_first_{c}"]) for c in MINORITY)
            + f" | {_f(m['exec_given_first_B'])} | | |"
        )
        lines.append(
            f"| {base} | always A, executed right (floor) | - | {CLASS_PROBS[0]:.3f} | | 0 / 0 / 0 | 0 / 0 / 0 | | | |"
        )
        for m in (v for v in summary["arm_means"].values() if v["base"] == base):
            lines.append(
                f"| {base} | {LABELS[m['arm']]} | {m['n']} | {_f(m['pass@64'])} | {_f(m['avg@64'])} | "
                + " / ".join(_f(m[f"pass@64_{c}"]) for c in MINORITY)
                + " | "
                + " / ".join(_f(m[f"p_first_{c}"]) for c in MINORITY)
                + f" | {_f(m['exec_given_first_B'])} | {m['entropy_strategy_last_quarter']:.3f} / "
                f"{m['entropy_exec_last_quarter']:.3f} | {m['masked_per_step_strategy']:.1f} / "
                f"{m['masked_per_step_exec']:.1f} |"
            )
    return "\n".join(lines) + "\n"


def _name(c: dict[str, Any]) -> str:
    return f"{LABELS[c['treated']]} - {LABELS[c['control']]}"


def comparison_table(summary: dict[str, Any]) -> str:
    lines = [
        "| scope | comparison | metric | n units | mean difference | 95 % t interval | sign-flip p | units > 0 "
        "| verdict |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for c in summary["comparisons"]:
        n = len(c["units"])
        for metric in ("pass@64", "avg@64"):
            r = c[metric]
            lines.append(
                f"| {c['scope']} | {_name(c)} | {metric} | {n} | {_f(r['mean'])} | [{_f(r['low'])}, {_f(r['high'])}] | "
                f"{r['p_sign_flip']:.3f} | {r['positive']}/{n} | **{r['verdict']}** |"
            )
    return "\n".join(lines) + "\n"


def per_unit_lines(summary: dict[str, Any]) -> str:
    lines = []
    for c in (c for c in summary["comparisons"] if c["scope"] == "pooled"):
        diffs = ", ".join(f"{b} s{s} {d:+.3f}" for (b, s), d in zip(c["units"], c["pass@64"]["diffs"], strict=True))
        lines.append(f"- {c['treated']} - {c['control']} (pass@64): {diffs}")
    return "\n".join(lines) + "\n"


def summary_tables(summary: dict[str, Any]) -> str:
    return (
        "# Horizon forking study: tables\n\n"
        + arm_table(summary)
        + "\n"
        + comparison_table(summary)
        + "\nPer-unit paired differences:\n\n"
        + per_unit_lines(summary)
    )


def status_line(summary: dict[str, Any]) -> str:
    primary = [r for r in summary["per_run"].values() if r["arm"] in LABELS and r["arm"] != "grpo_null"]
    pooled = [c for c in summary["comparisons"] if c["scope"] == "pooled" and c["control"] == "grpo"]
    n = len(pooled[0]["units"]) if pooled else 0
    text = (
        f"**Status: {len(primary)} of the {PRIMARY_RUNS} pre-registered primary runs have finished; {n} of 10 "
        "(base, seed) units have all three primary arms.**"
    )
    if n == 0:
        text += " No comparison yet."
    elif n < 6:
        text += (
            f" With n = {n} units the smallest possible sign-flip p is 2/2^{n} = {2 / 2**n if n else 1:.3f}, so no "
            "comparison can be better/worse yet: every verdict below is provisional."
        )
    return text


def readme_block(summary: dict[str, Any]) -> str:
    verdicts = []
    for c in summary["comparisons"]:
        p, a = c["pass@64"], c["avg@64"]
        verdicts.append(
            f"- {c['scope']}: **{_name(c)}** (n = {len(c['units'])}): pass@64 **{p['verdict']}** ({_f(p['mean'])}, "
            f"[{_f(p['low'])}, {_f(p['high'])}], p = {p['p_sign_flip']:.3f}); avg@64 **{a['verdict']}** "
            f"({_f(a['mean'])}, [{_f(a['low'])}, {_f(a['high'])}], p = {a['p_sign_flip']:.3f})"
        )
    for m in summary["arm_means"].values():
        if "replay_matched_share" in m:
            verdicts.append(
                f"- {m['base']} {LABELS[m['arm']]}: masked {m['replay_matched_share']:.0%} of the replayed Clip_B "
                "count (mean over seeds); at the other steps it had fewer A < 0 tokens than Clip_B masked and "
                "masked them all"
            )
    name = summary["experiment"]
    option = "" if name == "horizon" else f" --experiment {name}"
    steps = summary["endpoint_steps"]
    return (
        f"_Generated by `python scripts/forking_horizon.py{option} --analyze --update-readme` from the "
        f"{summary['n_runs']} committed runs in `scripts/forking/experiments/{name}/per_run/` (code revision "
        f"{summary['code_revision']}, torch {', '.join(summary['torch'])}, {summary['run_minutes_total']} "
        f"run-minutes, {summary['run_minutes_total'] / max(summary['n_runs'], 1):.1f} min per run at 1 thread on "
        "shared cores). Endpoint: mean of the last 3 evaluations (steps "
        f"{', '.join(map(str, steps)) if steps else '-'}) of the exact class-weighted test metric; primary verdicts "
        "pool fork-s0 and fork-s1 over (base, seed) units; pre-registered in "
        f"`experiments/{name}/PREREGISTRATION.md`._\n\n"
        + status_line(summary)
        + f"\n\nRule: {RULE}.\n\n"
        + "\n".join([*verdicts, f"- {PAPER}"])
        + "\n\n"
        + arm_table(summary)
        + (
            "\n" + comparison_table(summary) + "\nPer-unit pass@64 differences:\n\n" + per_unit_lines(summary)
            if summary["comparisons"]
            else ""
        )
    )


def plot(summary: dict[str, Any], path: Any) -> None:
    """Class-weighted test pass@64 against the step, one panel per base: every run (thin) and the mean (thick)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = list(summary["base_models"])
    fig, axes = plt.subplots(1, len(bases), figsize=(6 * len(bases), 4), squeeze=False)
    for ax, base in zip(axes[0], bases, strict=True):
        for i, arm in enumerate(LABELS):
            curves = [c for name, c in summary["pass64_curves"].items() if name.startswith(f"{base}__{arm}__s")]
            if not curves:
                continue
            for c in curves:
                ax.plot([int(s) for s in c], list(c.values()), color=f"C{i}", lw=0.5, alpha=0.5)
            steps = sorted(set.intersection(*({int(s) for s in c} for c in curves)))
            mean = [sum(c.get(s, c.get(str(s), 0.0)) for c in curves) / len(curves) for s in steps]
            ax.plot(steps, mean, color=f"C{i}", lw=2, label=f"{LABELS[arm]} (n={len(curves)})")
        ax.axhline(CLASS_PROBS[0], color="grey", ls="--", lw=1, label="always A (floor)")
        ax.set_title(base)
        ax.set_xlabel("RL step")
        ax.set_ylabel("test pass@64, class-weighted (exact)")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)

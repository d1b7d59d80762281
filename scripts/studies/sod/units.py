"""Analysis of a sum-or-difference experiment on several base models (experiment E, ``--experiment sod_robust``).

The unit is a (base, seed) pair. Reads only the committed per-run results
(``<exp>/per_run/<base>__<arm>__s<seed>/{eval,train}.csv`` and ``done.json``), applies issue 39's rule fixed in
``experiments/sod_robust/PREREGISTRATION.md`` and writes ``<exp>/summary.json``, ``<exp>/readme_block.md`` and
``<exp>/pass_at_64.png``; ``--update-readme`` copies the block into ``scripts/forking/README.md`` and a shorter
one (``<exp>/docs_block.md``: status, rule, pooled verdicts, arm table) into ``docs/study.md``.

    python -m scripts.studies.sod --experiment sod_robust --analyze --update-readme

Families, each corrected by Holm with Bonferroni intervals (``scripts/studies/sod/multiplicity.py``): the primary one
(the design's comparisons on pass@64 pooled over the units where every arm finished), the same on avg@64, the
design's secondary family on pass@64 (experiment F: each method - Clip_B) and, where the design judges them, one
per base on pass@64 (otherwise the per-base differences are descriptive). Until every unit is complete the block
says it is provisional; with no run yet it says so (n = 0).

    python -m scripts.studies.sod --experiment sod_methods --analyze --update-readme   # experiment F likewise
"""

from __future__ import annotations

import json
from pathlib import Path
from statistics import fmean
from typing import Any

from scripts.studies.analysis import load_runs, mean_row, provenance, replace_block
from scripts.studies.report import PAPER, markdown_table, per_base_rows, save_figure
from scripts.studies.results import load_runs as load_table
from scripts.studies.sod.analysis import README, ROOT, curve, endpoint, train_summary
from scripts.studies.sod.design import DELTA, LABELS, Experiment
from scripts.studies.sod.multiplicity import corrected_verdict, family_level, holm, sign_flip_p
from scripts.studies.statistics import paired_t_interval
from scripts.studies.tasks.sum_or_difference import always_sum_share

DOCS = ROOT / "docs" / "study.md"
#: Experiment C's committed runs: E's ``sod-s0`` ``grpo`` / ``clip_b`` runs are the same runs at a later commit.
C_RUNS = ROOT / "scripts" / "forking" / "experiments" / "sod"
#: Clip_B's early window: in C, GRPO collapses onto L within the first ~80 steps.
EARLY_STEPS = 50
Key = tuple[str, str, int]  # (base, arm, seed)
Unit = tuple[str, int]  # (base, seed)
ROLES = ("strategy", "exec")  # token roles of train.csv (scripts/studies/controls.py, which loads torch)


def run_row(run: dict[str, Any]) -> dict[str, Any]:
    """Endpoints (overall and per class), entropy and masked counts by role, and Clip_B's early masking."""
    row: dict[str, Any] = dict(endpoint(run["eval"]))
    for cls in ("sum", "diff"):
        row.update({f"{k}_{cls}": v for k, v in endpoint(run["eval"], cls).items()})
    row.update(train_summary(run["train"]))
    early = [r for r in run["train"] if int(r["step"]) <= EARLY_STEPS]
    row["masked_strategy_early"] = fmean(int(r["masked_n_strategy"]) for r in early)
    row["steps_masking_strategy"] = fmean(int(r["masked_n_strategy"]) > 0 for r in run["train"])
    if "acted_n_strategy" in run["train"][0]:  # experiment F: what the method acted on, per rollout batch
        for role in ROLES:
            row[f"acted_per_step_{role}"] = fmean(int(r[f"acted_n_{role}"]) for r in run["train"])
            row[f"acted_early_{role}"] = fmean(int(r[f"acted_n_{role}"]) for r in early)
            row[f"acted_share_{role}"] = fmean(
                int(r[f"acted_n_{role}"]) / max(int(r[f"tokens_{role}"]), 1) for r in run["train"]
            )
    row["seconds"] = run["done"]["seconds"]
    return row


def complete_units(table: dict[Key, dict[str, Any]], arms: tuple[str, ...], bases: tuple[str, ...]) -> list[Unit]:
    """Units where every arm of ``arms`` finished, base by base in the design's order, then by seed."""
    seeds = {s for _, _, s in table}
    return [(b, s) for b in bases for s in sorted(seeds) if all((b, a, s) in table for a in arms)]


def _test(table: dict[Key, dict[str, Any]], treated: str, control: str, units: list[Unit], metric: str, m: int):
    x = [table[(b, treated, s)][metric] for b, s in units]
    y = [table[(b, control, s)][metric] for b, s in units]
    diffs = [a - c for a, c in zip(x, y, strict=True)]
    plain = paired_t_interval(x, y)
    fam = paired_t_interval(x, y, level=family_level(m))
    return {
        "treated": treated,
        "control": control,
        "metric": metric,
        "units": [f"{b} s{s}" for b, s in units],
        "mean": plain.estimate,
        "low95": plain.low,
        "high95": plain.high,
        "low": fam.low,
        "high": fam.high,
        "level": family_level(m),
        "p_sign_flip": sign_flip_p(diffs),
        "positive": sum(d > 0 for d in diffs),
        "diffs": diffs,
    }


def family(
    name: str,
    table: dict[Key, dict[str, Any]],
    pairs: tuple[tuple[str, str], ...],
    units: list[Unit],
    metric: str,
    kind: str = "secondary",
) -> dict[str, Any]:
    """One family of comparisons on the same units: Holm over its p-values, Bonferroni intervals, verdicts
    (``kind``: primary or secondary, as the block names it)."""
    m = len(pairs)
    tests = [_test(table, t, c, units, metric, m) for t, c in pairs]
    for test, p_holm in zip(tests, holm([t["p_sign_flip"] for t in tests]), strict=True):
        test["p_holm"] = p_holm
        test["verdict"] = corrected_verdict(test["low"], test["high"], test["mean"], p_holm, DELTA)
    return {"name": name, "kind": kind, "metric": metric, "m": m, "n": len(units), "tests": tests}


def _values(rows: list[dict[str, str]]) -> list[list[float | str]]:
    """Rows as numbers where a value is one (two tables may spell one float differently: ``0.5`` / ``.5``)."""

    def value(text: str) -> float | str:
        try:
            return float(text)
        except ValueError:
            return text

    return [[value(v) for v in row.values()] for row in rows]


def replication(table: dict[Key, dict[str, Any]], exp: Path, base: str) -> dict[str, Any]:
    """Which of E's ``base`` runs of C's arms have evaluation rows identical to C's run of that seed (every value
    equal as written)."""
    checked, same = [], []
    c_runs, e_runs = load_table(C_RUNS), load_table(exp)
    for b, arm, seed in sorted(table):
        c_run = c_runs.get(f"{arm}__s{seed}")
        if b != base or c_run is None:
            continue
        checked.append(f"{arm} s{seed}")
        if _values(e_runs[f"{b}__{arm}__s{seed}"]["eval"]) == _values(c_run["eval"]):
            same.append(f"{arm} s{seed}")
    return {"base": base, "checked": checked, "identical": same}


def analyze_units(exp: Path, design: Experiment, experiment: str, update_readme: bool = False) -> dict[str, Any]:
    runs = load_runs(exp)
    table = {key: run_row(run) for key, run in runs.items()}
    bases, arms = tuple(design.bases), tuple(design.arms)
    units = complete_units(table, arms, bases)
    families, descriptive = [], []
    if len(units) >= 2:
        families.append(family("pooled", table, design.comparisons, units, "pass@64", "primary"))
        families.append(family("pooled", table, design.comparisons, units, "avg@64"))
        if design.secondary:
            families.append(family("pooled", table, design.secondary, units, "pass@64"))
        # Descriptive only (no verdict, no correction): E's other mu against C's 2.5, F's grpo_mb4 - grpo.
        descriptive += [_test(table, t, c, units, "pass@64", 1) for t, c in design.descriptive]
    for base in bases:
        own = [u for u in units if u[0] == base]
        if len(own) >= 2 and design.per_base_verdicts:
            families.append(family(base, table, design.comparisons, own, "pass@64"))
        elif len(own) >= 2:
            descriptive += [{**_test(table, t, c, own, "pass@64", 1), "base": base} for t, c in design.comparisons]
    means: dict[str, dict[str, Any]] = {}
    for base in bases:
        for arm in arms:
            rows = [r for (b, a, _), r in table.items() if (b, a) == (base, arm)]
            if rows:
                means[f"{base}__{arm}"] = {"base": base, "arm": arm, **mean_row(rows)}
    step0 = {}
    for base in bases:
        first = next((r for (b, _, _), r in sorted(runs.items()) if b == base), None)
        if first is not None:
            rows = [r for r in first["eval"] if r["step"] == "0"]
            step0[base] = {**endpoint(rows), **{f"{k}_diff": v for k, v in endpoint(rows, "diff").items()}}
    summary = {
        "experiment": experiment,
        "directory": design.directory,
        "planned_runs": design.planned_runs,
        "planned_units": len(bases) * len(design.seeds),
        "finished_runs": len(runs),
        "units": [f"{b} s{s}" for b, s in units],
        "units_per_base": {b: sum(u[0] == b for u in units) for b in bases},
        **provenance(runs),
        "base_models": step0,
        "arm_means": means,
        "families": families,
        "descriptive": descriptive,
        "replication": replication(table, exp, bases[0]),
        "per_run": {f"{b}__{a}__s{s}": {"base": b, "arm": a, "seed": s, **r} for (b, a, s), r in sorted(table.items())},
        "pass64_curves": {f"{b}__{a}__s{s}": curve(r["eval"]) for (b, a, s), r in sorted(runs.items())},
    }
    (exp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True) + "\n")
    if runs:
        plot_units(summary, exp / "pass_at_64.png")
    block, short = readme_block(summary, design), docs_block(summary, design)
    (exp / "readme_block.md").write_text(block)
    (exp / "docs_block.md").write_text(short)
    if update_readme:
        for path, text in ((README, block), (DOCS, short)):
            changed = replace_block(path, design.marker, text)
            print(f"[forking_sod] {path.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}", flush=True)
    print(block, flush=True)
    return summary


def _f(x: float) -> str:
    return f"{x:+.3f}"


def _label(test: dict[str, Any]) -> str:
    return f"{LABELS[test['treated']]} - {LABELS[test['control']]}"


def rule_text(design: Experiment) -> str:
    m = len(design.comparisons)
    families = (
        f"each family of {m} comparisons (the three mu); each interval is the family's Bonferroni interval "
        f"({family_level(m):.2%} here)"
        if not design.secondary
        else f"each family (primary and avg@64: the {m} comparisons with GRPO, m = {m}; each method - Clip_B, "
        f"m = {len(design.secondary)}); each interval is the family's Bonferroni interval ({family_level(m):.2%} / "
        f"{family_level(len(design.secondary)):.2%})"
    )
    return (
        f"Holm over {families}, p the Holm-adjusted exact sign-flip p. better/worse: the interval "
        f"excludes 0, |mean| >= {DELTA} and p < 0.05; none: the interval lies inside +-{DELTA}; small, consistent: "
        f"the interval excludes 0 and p < 0.05 but |mean| < {DELTA} and the interval reaches beyond +-{DELTA}; "
        "otherwise inconclusive"
    )


def family_table(summary: dict[str, Any]) -> str:
    header = (
        "| family | comparison | metric | n units | mean difference | 95 % t interval | family interval | "
        "sign-flip p | Holm p | units > 0 | verdict |"
    )
    rows = (
        f"| {fam['name']} | {_label(t)} | {t['metric']} | {fam['n']} | {_f(t['mean'])} | "
        f"[{_f(t['low95'])}, {_f(t['high95'])}] | [{_f(t['low'])}, {_f(t['high'])}] ({t['level']:.2%}) | "
        f"{t['p_sign_flip']:.4f} | {t['p_holm']:.4f} | {t['positive']}/{fam['n']} | **{t['verdict']}** |"
        for fam in summary["families"]
        for t in fam["tests"]
    )
    return markdown_table(header, rows)


def arm_table(summary: dict[str, Any]) -> str:
    header = (
        "| base | arm | seeds | pass@64 | avg@64 | pass@64 diff prompts | P(R) on diff prompts | entropy strategy / "
        f"exec (last quarter, nats) | masked strategy tokens per step (run / steps 1-{EARLY_STEPS}) | steps "
        "masking a strategy token | masked exec tokens per step |"
    )
    floor = f"| all | always L, arithmetic right (floor) | - | {always_sum_share('test'):.3f} | | | 0 | | | | |"

    def base_rows(base: str, b0: dict[str, Any]) -> list[str]:
        return [
            f"| {base} | base model (step 0) | - | {b0['pass@64']:.3f} | {b0['avg@64']:.3f} | "
            f"{b0['pass@64_diff']:.3f} | {b0['p_R_diff']:.3f} | | | | |"
        ]

    def arm_row(m: dict[str, Any]) -> str:
        return (
            f"| {m['base']} | {LABELS[m['arm']]} | {m['n']} | {m['pass@64']:.3f} | {m['avg@64']:.3f} | "
            f"{m['pass@64_diff']:.3f} | {m['p_R_diff']:.3f} | {m['entropy_strategy_last_quarter']:.3f} / "
            f"{m['entropy_exec_last_quarter']:.3f} | {m['masked_per_step_strategy']:.1f} / "
            f"{m['masked_strategy_early']:.1f} | {m['steps_masking_strategy']:.0%} | {m['masked_per_step_exec']:.1f} |"
        )

    rows = [floor, *per_base_rows(summary, base_rows, arm_row)]
    return markdown_table(header, rows)


def methods_arm_table(summary: dict[str, Any]) -> str:
    """Experiment F's arm table: endpoints, entropies and the tokens each method acted on (masked, penalised or
    reweighted: ``acted_n_<role>`` of ``train.csv``) per rollout batch, by role."""
    header = (
        "| base | arm | seeds | pass@64 | avg@64 | pass@64 diff prompts | P(R) on diff prompts | entropy strategy / "
        f"exec (last quarter, nats) | acted-on tokens per batch strategy / exec (run) | (batches 1-{EARLY_STEPS}) | "
        "acted-on share strategy / exec |"
    )

    def base_rows(base: str, b0: dict[str, Any]) -> list[str]:
        return [
            f"| {base} | base model (step 0) | - | {b0['pass@64']:.3f} | {b0['avg@64']:.3f} | "
            f"{b0['pass@64_diff']:.3f} | {b0['p_R_diff']:.3f} | | | | |"
        ]

    def arm_row(m: dict[str, Any]) -> str:
        acted = [m.get(f"acted_{k}_{r}", float("nan")) for k in ("per_step", "early", "share") for r in ROLES]
        return (
            f"| {m['base']} | {LABELS[m['arm']]} | {m['n']} | {m['pass@64']:.3f} | {m['avg@64']:.3f} | "
            f"{m['pass@64_diff']:.3f} | {m['p_R_diff']:.3f} | {m['entropy_strategy_last_quarter']:.3f} / "
            f"{m['entropy_exec_last_quarter']:.3f} | {acted[0]:.1f} / {acted[1]:.1f} | {acted[2]:.1f} / "
            f"{acted[3]:.1f} | {acted[4]:.1%} / {acted[5]:.1%} |"
        )

    floor = f"| all | always L, arithmetic right (floor) | - | {always_sum_share('test'):.3f} | | | 0 | | | | |"
    return markdown_table(header, [floor, *per_base_rows(summary, base_rows, arm_row)])


def _arm_table(summary: dict[str, Any], design: Experiment) -> str:
    return methods_arm_table(summary) if design.secondary else arm_table(summary)


def _header(summary: dict[str, Any]) -> str:
    minutes, exp = summary["run_minutes_total"], summary["directory"]
    if not summary["finished_runs"]:
        return (
            f"_Generated by `python -m scripts.studies.sod --experiment {summary['experiment']} --analyze "
            f"--update-readme`: no committed run in `scripts/forking/experiments/{exp}/` yet; pre-registered in "
            f"`experiments/{exp}/PREREGISTRATION.md`._\n\n"
        )
    return (
        f"_Generated by `python -m scripts.studies.sod --experiment {summary['experiment']} --analyze "
        f"--update-readme` from the {summary['finished_runs']} committed runs in "
        f"`scripts/forking/experiments/{exp}/runs.parquet` (code revision {summary['code_revision']}, torch "
        f"{', '.join(summary['torch'])}, {minutes} run-minutes, {minutes / summary['finished_runs']:.1f} min per run "
        "at 1 thread, niced, on shared cores). Endpoint: mean of the last 3 evaluations (steps 320-400) of the exact "
        f"test-set metric; pre-registered in `experiments/{exp}/PREREGISTRATION.md`._\n\n"
    )


def _status(summary: dict[str, Any], design: Experiment) -> str:
    per_base = ", ".join(f"{b} {n}" for b, n in summary["units_per_base"].items())
    final = summary["finished_runs"] == summary["planned_runs"]
    return (
        f"**Status: {'final' if final else 'PROVISIONAL'}: {summary['finished_runs']} of the "
        f"{summary['planned_runs']} pre-registered runs have finished; {len(summary['units'])} of the "
        f"{summary['planned_units']} (base, seed) units have all {len(design.arms)} arms ({per_base}).**"
        + ("" if final else " The verdicts below use those units only and are not the experiment's verdicts.")
    )


def _pooled_lines(summary: dict[str, Any]) -> list[str]:
    lines = []
    for fam in summary["families"]:
        if fam["name"] != "pooled":
            continue
        for t in fam["tests"]:
            lines.append(
                f"- {fam['kind']}, pooled: **{_label(t)}** {t['metric']} (n = {fam['n']}): **{t['verdict']}** "
                f"({_f(t['mean'])}, {t['level']:.2%} [{_f(t['low'])}, {_f(t['high'])}], 95 % [{_f(t['low95'])}, "
                f"{_f(t['high95'])}], p = {t['p_sign_flip']:.4f}, Holm p = {t['p_holm']:.4f}, "
                f"{t['positive']}/{fam['n']} units > 0)"
            )
    return lines


def _no_runs(summary: dict[str, Any], design: Experiment) -> str:
    """The block before the first run: provisional, n = 0, and the rule that will judge the runs."""
    return (
        _header(summary) + f"{_status(summary, design)}\n\nRule: {rule_text(design)}.\n\nNo verdict yet: n = 0 units.\n"
    )


def _paper(design: Experiment) -> str:
    # F's papers' headline results are not quoted yet (the pre-registration: "not quoted" until checked).
    return "papers' own headline results: not quoted yet" if design.secondary else PAPER


def docs_block(summary: dict[str, Any], design: Experiment) -> str:
    """The short block of docs/study.md: status, rule, pooled verdicts, arm table."""
    if not summary["per_run"]:
        return _no_runs(summary, design)
    return (
        _header(summary)
        + f"{_status(summary, design)}\n\nRule: {rule_text(design)}.\n\n"
        + "\n".join([*_pooled_lines(summary), f"- {_paper(design)}"])
        + "\n\n"
        + _arm_table(summary, design)
        + "\nPer-base families, per-unit differences and the replication check: `scripts/forking/README.md`.\n"
    )


def readme_block(summary: dict[str, Any], design: Experiment) -> str:
    """The generated README block; before the first run finishes, the status (n = 0) and the rule."""
    if not summary["per_run"]:
        return _no_runs(summary, design)
    lines = _pooled_lines(summary)
    for t in summary["descriptive"]:
        lines.append(
            f"- descriptive, {t.get('base', 'pooled')} (no verdict): {_label(t)} pass@64 {_f(t['mean'])} "
            f"(95 % [{_f(t['low95'])}, {_f(t['high95'])}], n = {len(t['units'])})"
        )
    rep = summary["replication"]
    if rep["checked"]:
        lines.append(
            f"- replication: {len(rep['identical'])} of {len(rep['checked'])} {rep['base']} runs of C's arms have an "
            "`eval.csv` byte-identical to C's run of the same seed (252820b)"
        )
    diffs = []
    for fam in summary["families"]:
        if fam["name"] == "pooled" and fam["metric"] == "pass@64":
            for t in fam["tests"]:
                shown = ", ".join(f"{u} {d:+.3f}" for u, d in zip(t["units"], t["diffs"], strict=True))
                diffs.append(f"- {t['treated']} - {t['control']} (pass@64): {shown}")
    return (
        _header(summary)
        + f"{_status(summary, design)}\n\nRule: {rule_text(design)}.\n\n"
        + "\n".join([*lines, f"- {_paper(design)}"])
        + "\n\n"
        + _arm_table(summary, design)
        + "\n"
        + family_table(summary)
        + ("\nPer-unit pass@64 differences:\n\n" + "\n".join(diffs) + "\n" if diffs else "")
    )


def plot_units(summary: dict[str, Any], path: Path) -> None:
    """Test pass@64 against the step, mean over the finished seeds: one panel per base, one colour per arm."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bases = list(summary["units_per_base"])
    fig, axes = plt.subplots(1, len(bases), figsize=(4 * len(bases), 3.5), sharey=True, squeeze=False)
    arms = list(dict.fromkeys(m["arm"] for m in summary["arm_means"].values()))
    for ax, base in zip(axes[0], bases, strict=True):
        for i, arm in enumerate(arms):
            curves = [c for name, c in summary["pass64_curves"].items() if name.startswith(f"{base}__{arm}__s")]
            if not curves:
                continue
            steps = sorted(set.intersection(*(set(c) for c in curves)))
            ax.plot(steps, [fmean(c[s] for c in curves) for s in steps], color=f"C{i}", label=f"{LABELS[arm]}")
        ax.axhline(always_sum_share("test"), color="grey", ls="--", lw=1)
        ax.set_title(base)
        ax.set_xlabel("RL step")
    axes[0][0].set_ylabel("test pass@64 (exact, mean over seeds)")
    axes[0][0].legend(fontsize=7)
    save_figure(fig, path)

"""Analysis of the forking study: reads only ``eval.parquet`` and ``train.parquet`` and writes the summary and plots.

    python -m scripts.studies.forking --analyze --out scripts/forking/results

Writes ``summary.json`` (every number the report quotes), ``summary.md`` (tables) and the PNG plots into the
study directory. The endpoints and the bootstrap are defined in ``design.py`` (fixed before the runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from scripts.studies.statistics import Interval, bootstrap_interval
from scripts.studies.tasks.forking import CLASS_PROBS, STRATEGIES

__all__ = ["analyze", "paired_bootstrap", "per_prompt_metric", "readme_block", "replace_block"]

WEIGHTS = {"forking": dict(zip(STRATEGIES, CLASS_PROBS, strict=True)), "chain": {"chain": 1.0}}
#: Human labels of the methods (``forking_design.METHODS``) as the README and the report print them.
LABELS = {
    "base": "base model",
    "grpo": "GRPO",
    "clip_b": "Clip_B mu 2.5",
    "clip_v": "Clip_V mu 8.5 cap 1e-4",
    "clip_v_rescaled": "Clip_V mu 8.5 cap 0.025",
    "random_mask": "random mask",
    "entropy_bonus": "entropy bonus (adaptive, target 0.02)",
    "clip_higher": "clip-higher 0.28",
}
#: The paper's own numbers (arXiv 2602.03392, Qwen2.5-7B on AIME24, one run each), GRPO -> Clip_B.
PAPER_ROW = (
    "| paper (Qwen2.5-7B, AIME24, 1 run) | GRPO -> Clip_B | 1 | Avg@32 16.88 -> 19.69 | Pass@32 50.00 -> 56.67 "
    "| +6.67 | +2.81 | |"
)


def _settings():
    """The study's fixed design (``scripts/studies/forking/design.py``), passed around as ``fs``."""
    import scripts.studies.forking.design as fs

    return fs


def per_prompt_metric(df: pd.DataFrame, metric: str) -> np.ndarray:
    """``avg`` (= p, the probability that one sample is the correct response) or ``pass@k`` = 1 - (1 - p)^k per row."""
    p = np.exp(df["logp"].to_numpy(dtype=np.float64))
    if metric == "avg":
        return p
    k = int(metric.split("@")[1])
    return -np.expm1(k * np.log1p(-np.minimum(p, 1.0 - 1e-16)))


def _weighted(values: np.ndarray, classes: np.ndarray, weights: dict[str, float]) -> float:
    return float(sum(w * values[classes == cls].mean() for cls, w in weights.items() if (classes == cls).any()))


def paired_bootstrap(
    diff: np.ndarray, classes: np.ndarray, weights: dict[str, float], draws: int, seed: int = 0
) -> Interval:
    """Mean over seeds of the class-weighted mean of ``diff`` [seeds, prompts], and a 95 % percentile interval
    (an :class:`Interval` over ``n`` = seeds; it unpacks as ``point, lo, hi``).

    Each draw resamples the seeds with replacement and, within each class, the prompts with replacement.
    """
    rng = np.random.default_rng(seed)
    point = float(np.mean([_weighted(row, classes, weights) for row in diff]))
    per_seed = np.zeros((diff.shape[0], draws))
    for cls, w in weights.items():
        cols = np.flatnonzero(classes == cls)
        if cols.size == 0:
            continue
        pick = cols[rng.integers(0, cols.size, size=(draws, cols.size))]  # [draws, n_c]
        per_seed += w * diff[:, pick].mean(-1)  # [seeds, draws]
    seeds = rng.integers(0, diff.shape[0], size=(draws, diff.shape[0]))
    stats = per_seed[seeds, np.arange(draws)[:, None]].mean(-1)
    return bootstrap_interval(point, stats.tolist(), level=0.95, n=diff.shape[0])


def _matrix(ev: pd.DataFrame, metric: str, seeds: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """[seeds, prompts] of ``metric`` (averaged over the steps present), prompts in a fixed order."""
    ev = ev.assign(value=per_prompt_metric(ev, metric))
    table = ev.groupby(["seed", "prompt", "class"], sort=True)["value"].mean().reset_index()
    wide = table.pivot(index="seed", columns="prompt", values="value").loc[seeds]
    classes = table.drop_duplicates("prompt").set_index("prompt").loc[wide.columns, "class"].to_numpy()
    return wide.to_numpy(), classes


def _endpoint_frames(ev: pd.DataFrame, fs: Any) -> dict[str, pd.DataFrame]:
    """Rows entering each endpoint: T = PRIMARY_T, last step or every step > 0."""
    at_t = ev[np.isclose(ev["temperature"], fs.PRIMARY_T)]
    last = at_t.groupby(["task", "base", "method", "seed"])["step"].transform("max")
    return {"last": at_t[at_t["step"] == last], "mean_over_evals": at_t[at_t["step"] > 0]}


def _summaries(ev: pd.DataFrame, fs: Any) -> pd.DataFrame:
    """Class-weighted and per-class avg@K and pass@k per run, step and temperature."""
    rows = []
    for key, g in ev.groupby(["task", "base", "method", "seed", "step", "temperature"], sort=True):
        classes = g["class"].to_numpy()
        weights = WEIGHTS[key[0]]
        rec = dict(zip(["task", "base", "method", "seed", "step", "temperature"], key, strict=True))
        for m in ["avg"] + [f"pass@{k}" for k in fs.KS]:
            vals = per_prompt_metric(g, m)
            rec[f"{m}_w"] = _weighted(vals, classes, weights)
            rec[f"{m}_macro"] = float(np.mean([vals[classes == c].mean() for c in weights if (classes == c).any()]))
            for cls in weights:
                if (classes == cls).any():
                    rec[f"{m}_{cls}"] = float(vals[classes == cls].mean())
        first = np.exp(g["logp_first"].to_numpy(dtype=np.float64))
        for cls in weights:
            if (classes == cls).any():
                rec[f"p_strategy_{cls}"] = float(first[classes == cls].mean())
        rows.append(rec)
    return pd.DataFrame(rows)


def analyze(out: Path, plots: bool = True) -> dict[str, Any]:
    """Write summary.json, summary.md, readme_table.md and (``plots``) the plots of the study in ``out``."""
    fs = _settings()
    out = Path(out)
    ev = pd.read_parquet(out / "eval.parquet")
    tr = pd.read_parquet(out / "train.parquet") if (out / "train.parquet").exists() else pd.DataFrame()
    summ = _summaries(ev, fs)
    summ.to_csv(out / "metrics_by_run.csv", index=False, float_format="%.5g")
    result: dict[str, Any] = {
        "primary": f"test pass@{fs.PRIMARY_K} and avg@{fs.PRIMARY_K}, T={fs.PRIMARY_T}, "
        "class-weighted; last step and mean over evaluations after step 0"
    }
    # A smoke study draws fewer samples than the endpoint's k; fall back to the largest k it has.
    k_primary = fs.PRIMARY_K
    pk = f"pass@{k_primary}"
    result["k_primary"] = k_primary

    # 1. Does GRPO show the phenomenon in every seed (avg up, pass@64 down vs the base)?
    result["phenomenon"] = _phenomenon(summ, fs, pk)
    # 2. Paired differences against GRPO with bootstrap intervals over seeds and prompts.
    paired = _paired_vs_grpo(ev, fs, k_primary)
    result["paired_vs_grpo"] = paired

    if not tr.empty:
        cols = [c for c in tr.columns if c.startswith(("entropy_", "masked"))]
        result["train_means"] = (
            tr.groupby(["task", "base", "method"])[cols].mean().reset_index().to_dict(orient="records")
        )
    result["compact"] = _compact(summ, paired, fs, pk)
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (out / "summary.md").write_text(_markdown(result, summ, fs))
    seconds_path = out / "run_seconds.json"
    seconds = json.loads(seconds_path.read_text()) if seconds_path.exists() else {}
    (out / "readme_table.md").write_text(readme_block(result, fs, seconds))
    if plots:
        _plots(out, summ, tr, pd.DataFrame(paired), fs)
    return result


def _phenomenon(summ: pd.DataFrame, fs: Any, pk: str) -> list[dict[str, Any]]:
    """Per task, base and method: in how many seeds avg@K rose and pass@K fell against the base model (last step)."""
    phen = []
    for (task, base), g in summ[np.isclose(summ["temperature"], fs.PRIMARY_T)].groupby(["task", "base"]):
        b = g[g["method"] == "base"]
        if b.empty:
            continue
        b = b.iloc[0]
        for method, gm in g[g["method"] != "base"].groupby("method"):
            last = gm[gm["step"] == gm.groupby("seed")["step"].transform("max")]
            up = (last["avg_w"] > b["avg_w"]).to_numpy()
            down = (last[f"{pk}_w"] < b[f"{pk}_w"]).to_numpy()
            phen.append(
                {
                    "task": task,
                    "base": base,
                    "method": method,
                    "seeds": int(len(last)),
                    "avg_up": int(up.sum()),
                    "pass_down": int(down.sum()),
                    "both": int((up & down).sum()),
                    "base_avg": b["avg_w"],
                    "base_pass": b[f"{pk}_w"],
                    "avg_mean": float(last["avg_w"].mean()),
                    "pass_mean": float(last[f"{pk}_w"].mean()),
                    "pass_D_mean": float(last.get(f"{pk}_D", pd.Series([np.nan])).mean()),
                    "base_pass_D": float(b.get(f"{pk}_D", np.nan)),
                }
            )
    return phen


def _paired_vs_grpo(ev: pd.DataFrame, fs: Any, k_primary: int) -> list[dict[str, Any]]:
    """Every method against GRPO, paired by seed: the four primary numbers with 95 % bootstrap intervals."""
    pk = f"pass@{k_primary}"
    paired = []
    frames = _endpoint_frames(ev[ev["method"] != "base"], fs)
    for (task, base), g in ev[ev["method"] != "base"].groupby(["task", "base"]):
        weights = WEIGHTS[task]
        for method in sorted(set(g["method"]) - {"grpo"}):
            for endpoint, frame in frames.items():
                sel = frame[(frame["task"] == task) & (frame["base"] == base)]
                seeds = sorted(set(sel[sel["method"] == method]["seed"]) & set(sel[sel["method"] == "grpo"]["seed"]))
                if not seeds:
                    continue
                for metric in (pk, "avg"):
                    # pass@64 needs n >= 64: every evaluation has it.
                    vm, classes = _matrix(sel[sel["method"] == method], metric, seeds)
                    vg, classes_g = _matrix(sel[sel["method"] == "grpo"], metric, seeds)
                    assert (classes == classes_g).all()
                    point, lo, hi = paired_bootstrap(vm - vg, classes, weights, fs.BOOTSTRAP)
                    paired.append(
                        {
                            "task": task,
                            "base": base,
                            "method": method,
                            "endpoint": endpoint,
                            "metric": f"{metric}@{k_primary}" if metric == "avg" else metric,
                            "seeds": len(seeds),
                            "diff": point,
                            "lo": lo,
                            "hi": hi,
                            "excludes_zero": bool(lo > 0 or hi < 0),
                        }
                    )
    return paired


def _compact(summ: pd.DataFrame, paired: list[dict[str, Any]], fs: Any, pk: str) -> list[dict[str, Any]]:
    """One row per task, base and method: last-step means over seeds and the paired last-step differences."""
    rows = []
    at_t = summ[np.isclose(summ["temperature"], fs.PRIMARY_T)]
    last = at_t[at_t["step"] == at_t.groupby(["task", "base", "method", "seed"])["step"].transform("max")]
    for (task, base, method), g in last.groupby(["task", "base", "method"]):
        rec = {"task": task, "base": base, "method": method, "seeds": int(len(g))}
        rec["avg"] = float(g["avg_w"].mean())
        rec["pass"] = float(g[f"{pk}_w"].mean())
        rec["pass_sd"] = float(g[f"{pk}_w"].std()) if len(g) > 1 else float("nan")
        for r in paired:
            if (r["task"], r["base"], r["method"], r["endpoint"]) == (task, base, method, "last"):
                key = "d_pass" if r["metric"] == pk else "d_avg"
                rec[key] = (r["diff"], r["lo"], r["hi"])
        rows.append(rec)
    return rows


def _markdown(result: dict[str, Any], summ: pd.DataFrame, fs: Any) -> str:
    pk = f"pass@{result['k_primary']}"
    lines = [f"Primary endpoint: {result['primary']}.", "", "## GRPO and the others against the base model", ""]
    lines += [
        f"| task | base | method | seeds | avg base -> run | {pk} base -> run | {pk} class D | avg up | {pk} down |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["phenomenon"]:
        lines.append(
            f"| {r['task']} | {r['base']} | {r['method']} | {r['seeds']} | "
            f"{r['base_avg']:.3f} -> {r['avg_mean']:.3f} | "
            f"{r['base_pass']:.3f} -> {r['pass_mean']:.3f} | {r['base_pass_D']:.3f} -> {r['pass_D_mean']:.3f} | "
            f"{r['avg_up']}/{r['seeds']} | {r['pass_down']}/{r['seeds']} |"
        )
    lines += ["", "## Paired differences against GRPO (mean over seeds, 95 % bootstrap over seeds and prompts)", ""]
    lines += [
        "| task | base | method | endpoint | metric | seeds | diff | interval |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["paired_vs_grpo"]:
        mark = " *" if r["excludes_zero"] else ""
        lines.append(
            f"| {r['task']} | {r['base']} | {r['method']} | {r['endpoint']} | {r['metric']} | {r['seeds']} | "
            f"{r['diff']:+.4f}{mark} | [{r['lo']:+.4f}, {r['hi']:+.4f}] |"
        )
    lines += ["", "`*`: the interval excludes zero.", ""]
    for task, base in _order(result, fs):
        lines += _endpoint_table(result["paired_vs_grpo"], task, base, fs)
    fmt = lambda d: f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else "-"  # noqa: E731
    lines += [
        f"## Compact table (T={fs.PRIMARY_T}, last step, class-weighted; differences paired by seed, 95 % bootstrap)",
        "",
        f"| task | base | method | seeds | avg@64 | {pk} (sd over seeds) | {pk} - GRPO | avg@64 - GRPO |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["compact"]:
        lines.append(
            f"| {r['task']} | {r['base']} | {r['method']} | {r['seeds']} | {r['avg']:.3f} | {r['pass']:.3f} "
            f"({r['pass_sd']:.3f}) | {fmt(r.get('d_pass'))} | {fmt(r.get('d_avg'))} |"
        )
    lines.append("")
    if result.get("train_means"):
        lines += [
            "## Training: entropy and masked share by token role (mean over steps and seeds)",
            "",
            "| task | base | method | entropy strategy token | entropy rest | masked strategy | masked rest "
            "| masked among A<0 strategy | masked among A<0 rest |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for r in result["train_means"]:
            lines.append(
                f"| {r['task']} | {r['base']} | {r['method']} | {r['entropy_strategy']:.4f} | {r['entropy_rest']:.4f} "
                f"| {r['masked_strategy']:.4f} | {r['masked_rest']:.5f} | {r['masked_neg_strategy']:.4f} "
                f"| {r['masked_neg_rest']:.5f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _plots(out: Path, summ: pd.DataFrame, tr: pd.DataFrame, paired: pd.DataFrame, fs: Any) -> None:
    """entropy_and_masking.png, pass_at_k_<base>.png (pass_at_k_neutral_<base>.png) and paired_vs_grpo.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {m: f"C{i}" for i, m in enumerate(["base", *fs.METHODS])}
    if not tr.empty:
        _plot_entropy(plt, out, tr, fs, colors)
    for task, base in sorted({(t, b) for t, b in zip(summ["task"], summ["base"], strict=True)}):
        _plot_pass_at_k(plt, out, summ[(summ["task"] == task) & (summ["base"] == base)], task, base, fs, colors)
    if not paired.empty:
        _plot_paired(plt, out, paired, fs, colors)


def _plot_entropy(plt: Any, out: Path, tr: pd.DataFrame, fs: Any, colors: dict[str, str]) -> None:
    """Per task (row): entropy of the strategy token and of the rest over steps (mean over bases and seeds, band
    = sd), and the masked share by token role."""
    tasks = [t for t in ("forking", "chain") if t in set(tr["task"])]
    fig, axes = plt.subplots(len(tasks), 3, figsize=(16, 4.2 * len(tasks)), squeeze=False)
    roles = ["masked_strategy", "masked_rest", "masked_neg_strategy", "masked_neg_rest"]
    for row, task in zip(axes, tasks, strict=True):
        t = tr[tr["task"] == task]
        methods = [m for m in fs.METHODS if m in set(t["method"])]
        for m in methods:
            g = t[t["method"] == m].groupby("step")
            for ax, col in zip(row[:2], ("entropy_strategy", "entropy_rest"), strict=True):
                mean, sd = g[col].mean(), g[col].std().fillna(0)
                ax.plot(mean.index, mean, color=colors[m], label=LABELS[m], lw=1.2)
                ax.fill_between(mean.index, mean - sd, mean + sd, color=colors[m], alpha=0.08)
        for ax, what in zip(row[:2], ("strategy token (response position 0)", "rest of the response"), strict=True):
            ax.set(title=f"{task}: entropy (nats), {what}", xlabel="step")
        row[0].legend(fontsize=7)
        means = t.groupby("method")[roles].mean().reindex(methods)
        x = np.arange(len(means))
        for i, col in enumerate(roles):
            row[2].bar(x + 0.2 * i - 0.3, means[col], width=0.2, label=col)
        row[2].set_xticks(x, [LABELS[m] for m in means.index], rotation=30, ha="right", fontsize=7)
        row[2].set_yscale("symlog", linthresh=1e-4)
        row[2].set(title=f"{task}: masked share by token role (mean over steps)", ylabel="share", ylim=(0, 1.5))
        row[2].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "entropy_and_masking.png", dpi=90)
    plt.close(fig)


def _plot_pass_at_k(
    plt: Any, out: Path, fb: pd.DataFrame, task: str, base: str, fs: Any, colors: dict[str, str]
) -> None:
    """pass@k against k per class (columns) and temperature (rows) at the last step (the base model: step 0)."""
    classes = [c for c in WEIGHTS[task] if f"pass@1_{c}" in fb.columns]
    fig, axes = plt.subplots(2, len(classes), figsize=(4 * len(classes) + 1, 7), sharey=True, squeeze=False)
    last = fb[fb["step"] == fb.groupby(["method", "seed"])["step"].transform("max")]
    for row, temp in enumerate(fs.TEMPERATURES):
        for col, cls in enumerate(classes):
            ax = axes[row, col]
            for m in ["base", *fs.METHODS]:
                g = last[(last["method"] == m) & np.isclose(last["temperature"], temp)]
                if not g.empty:
                    ks = list(fs.KS)
                    ax.plot(ks, [g[f"pass@{k}_{cls}"].mean() for k in ks], marker=".", color=colors[m], label=LABELS[m])
            ax.set(xscale="log", title=f"class {cls}, T={temp}", xlabel="k")
    axes[0, 0].set_ylabel("pass@k (test, last step)")
    axes[0, 0].legend(fontsize=7)
    fig.suptitle(f"{task} / {base}: pass@k per class (mean over seeds; avg@K = pass@1)")
    fig.tight_layout()
    fig.savefig(out / (f"pass_at_k_{base}.png" if task == "forking" else f"pass_at_k_neutral_{base}.png"), dpi=90)
    plt.close(fig)


def _plot_paired(plt: Any, out: Path, paired: pd.DataFrame, fs: Any, colors: dict[str, str]) -> None:
    """Method - GRPO per (task, base) row, one panel per endpoint and metric, 95 % bootstrap intervals."""
    order = {m: i for i, m in enumerate(fs.METHODS)}
    paired = paired.assign(
        key=[
            (t != "forking", b, order[m], m)
            for t, b, m in zip(paired["task"], paired["base"], paired["method"], strict=True)
        ]
    )
    panels = sorted(set(zip(paired["endpoint"], paired["metric"], strict=True)))
    rows = sorted(set(paired["key"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(2 + 3.5 * len(panels), 1.5 + 0.3 * len(rows)), squeeze=False)
    for ax, (endpoint, metric) in zip(axes[0], panels, strict=True):
        g = paired[(paired["endpoint"] == endpoint) & (paired["metric"] == metric)]
        for r in g.itertuples():
            y = rows.index(r.key)
            err = [[r.diff - r.lo], [r.hi - r.diff]]
            ax.errorbar(r.diff, y, xerr=err, fmt="o", color=colors[r.method], ms=4)
        ax.axvline(0, color="k", lw=0.8)
        labels = [f"{k[1]}: {LABELS[k[3]].split(' (')[0]}" for k in rows] if ax is axes[0, 0] else []
        ax.set_yticks(range(len(rows)), labels, fontsize=7)
        ax.set_ylim(len(rows) - 0.5, -0.5)
        ax.set(title=f"{metric}, {endpoint}\nminus GRPO (95% CI)")
    fig.tight_layout()
    fig.savefig(out / "paired_vs_grpo.png", dpi=90)
    plt.close(fig)


def _endpoint_table(paired: list[dict[str, Any]], task: str, base: str, fs: Any) -> list[str]:
    """The four primary numbers of every method against GRPO on one base model (the neutral task's question:
    does anything hurt it?)."""
    rows = {(r["method"], r["endpoint"], r["metric"][:4]): r for r in paired if (r["task"], r["base"]) == (task, base)}
    if not rows:
        return []
    title = "Neutral task: does anything hurt the chain task?" if task == "chain" else f"Primary endpoint on {base}"
    lines = [
        f"## {title} (method - GRPO, paired by seed, 95 % bootstrap)",
        "",
        "| method | seeds | pass@K last | avg@K last | pass@K mean over evals | avg@K mean over evals | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for method in fs.METHODS:
        cells = [rows.get((method, e, m)) for e in ("last", "mean_over_evals") for m in ("pass", "avg@")]
        if not any(cells):
            continue
        seeds = max(c["seeds"] for c in cells if c)
        text = [_ci((c["diff"], c["lo"], c["hi"])) if c else "-" for c in cells]
        verdict = _verdict(paired, task, base, method)[0]
        lines.append(f"| {LABELS[method]} | {seeds} | {' | '.join(text)} | {verdict} |")
    return [*lines, ""]


# ------------------------------------------------------------------------ README / report block (generated)
def _ci(d: tuple[float, float, float] | None) -> str:
    return f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]" if d else ""


def _order(result: dict[str, Any], fs: Any) -> list[tuple[str, str]]:
    """(task, base) pairs present: the forking bases first, then the neutral task."""
    pairs = {(r["task"], r["base"]) for r in result["compact"]}
    return sorted(pairs, key=lambda tb: (tb[0] != "forking", tb[1]))


def _headline_rows(result: dict[str, Any], fs: Any) -> list[str]:
    """Markdown rows of the headline table: per (task, base) the base model, then the methods of ``fs.METHODS``."""
    compact = {(r["task"], r["base"], r["method"]): r for r in result["compact"]}
    phen = {(r["task"], r["base"], r["method"]): r for r in result["phenomenon"]}
    rows = []
    for task, base in _order(result, fs):
        name = base if task == "forking" else f"{base} (neutral)"
        for method in ["base", *fs.METHODS]:
            r = compact.get((task, base, method))
            if r is None:
                continue
            p = phen.get((task, base, method))
            seeds = "-" if method == "base" else str(r["seeds"])
            shows = f"{p['both']}/{p['seeds']}" if p else ""
            rows.append(
                f"| {name} | {LABELS[method]} | {seeds} | {r['avg']:.3f} | {r['pass']:.3f} | "
                f"{_ci(r.get('d_pass'))} | {_ci(r.get('d_avg'))} | {shows} |"
            )
    return rows


def _verdict(paired: list[dict[str, Any]], task: str, base: str, method: str) -> tuple[str, list[str]]:
    """'better' / 'worse' / 'mixed' / 'no difference' against GRPO over the four primary numbers (pass@K and
    avg@K, last step and mean over evaluations), and the numbers whose interval excludes zero."""
    rows = [r for r in paired if (r["task"], r["base"], r["method"]) == (task, base, method)]
    if not rows:
        return "not run", []
    above = [r for r in rows if r["lo"] > 0]
    below = [r for r in rows if r["hi"] < 0]
    verdict = {(True, False): "better", (False, True): "worse", (True, True): "mixed"}.get(
        (bool(above), bool(below)), "no difference"
    )
    when = {"last": "last step", "mean_over_evals": "mean over evals"}
    details = [
        f"{r['metric']} {when[r['endpoint']]} {r['diff']:+.3f} [{r['lo']:+.3f}, {r['hi']:+.3f}]" for r in above + below
    ]
    return verdict, details


def _method_sentence(paired: list[dict[str, Any]], bases: list[tuple[str, str]], method: str) -> tuple[str, int]:
    """'fork-s0 worse (...), fork-s1 no difference' and the number of bases where ``method`` is better."""
    parts, better = [], 0
    for task, base in bases:
        verdict, details = _verdict(paired, task, base, method)
        better += verdict == "better"
        parts.append(f"{base} {verdict}" + (f" ({'; '.join(details)})" if details else ""))
    return ", ".join(parts), better


def _phenomenon_sentence(result: dict[str, Any], pk: str) -> str:
    rows = [r for r in result["phenomenon"] if r["task"] == "forking" and r["method"] == "grpo"]
    if not rows:
        return "No GRPO runs on the forking task in the tables yet."
    parts = [
        f"{r['both']}/{r['seeds']} seeds on {r['base']} (class D {pk} {r['base_pass_D']:.3f} -> {r['pass_D_mean']:.3f})"
        for r in rows
    ]
    every = all(r["both"] == r["seeds"] for r in rows)
    return (
        f"GRPO shows the phenomenon (avg@{pk[5:]} up and {pk} down against the base model at the last step) in "
        + " and ".join(parts)
        + (": in every seed." if every else ": **not** in every seed.")
    )


def _answers(result: dict[str, Any], fs: Any, pk: str) -> list[str]:
    """The issue's questions answered from the numbers: phenomenon, Clip_B, the controls, the neutral task."""
    paired = result["paired_vs_grpo"]
    fork = [tb for tb in _order(result, fs) if tb[0] == "forking"]
    lines = [f"- {_phenomenon_sentence(result, pk)}"]
    clip_b, better = _method_sentence(paired, fork, "clip_b")
    lines.append(
        f"- {LABELS['clip_b']} against GRPO on the four primary numbers ({pk} and avg@{pk[5:]}, last step and mean "
        f"over evaluations; in brackets those whose 95 % interval excludes zero): {clip_b}. "
        f"Clip_B beats GRPO (some primary number's interval above zero, none below) on {better} of {len(fork)} base "
        "models."
    )
    lines.append("- The others against GRPO (same reading):")
    lines += [
        f"  - {LABELS[m]}: {_method_sentence(paired, fork, m)[0]}" for m in fs.METHODS if m not in ("grpo", "clip_b")
    ]
    lines += _null_control(paired, fork)
    chain = [tb for tb in _order(result, fs) if tb[0] == "chain"]
    neutral = [(m, *_verdict(paired, *chain[0], m)) for m in fs.METHODS if m != "grpo"] if chain else []
    neutral = [n for n in neutral if n[1] != "not run"]
    if not neutral:
        lines.append("- The neutral chain task has no RL runs against GRPO in the tables yet.")
    else:
        hurt = [n for n in neutral if n[1] in ("worse", "mixed")]
        said = "; ".join(f"{LABELS[m]} {v}" + (f" ({'; '.join(d)})" if d else "") for m, v, d in neutral)
        lines.append(
            f"- Neutral chain task against GRPO: {said}. {len(hurt)} of {len(neutral)} methods hurt it "
            "(some interval below zero)."
        )
    return lines


def _null_control(paired: list[dict[str, Any]], fork: list[tuple[str, str]]) -> list[str]:
    """How often clip-higher, which is GRPO here, clears the interval: the comparison's false-positive rate."""
    rows = [r for r in paired if r["method"] == "clip_higher" and (r["task"], r["base"]) in fork]
    if not rows:
        return []
    hits = [r for r in rows if r["lo"] > 0 or r["hi"] < 0]
    return [
        f"- Calibration: clip-higher is GRPO here (one update per batch, the ratio is exactly 1, no clip binds), so "
        f"its runs differ from GRPO's only through chaotic divergence of the trajectories (floating-point order, "
        f"code revisions between the sessions that ran them). {len(hits)} of its {len(rows)} primary intervals "
        "exclude zero"
        + (f" ({'; '.join(r['base'] + ' ' + r['metric'] + ' ' + r['endpoint'] for r in hits)})" if hits else "")
        + ": read a single interval excluding zero for another method with that false-positive rate in mind."
    ]


def _coverage(result: dict[str, Any], fs: Any, seconds: dict[str, float]) -> list[str]:
    """Which cells of the design grid are incomplete, and the measured wall time (sum of per-run seconds)."""
    design = fs.full_grid()
    have = {(r["task"], r["base"], r["method"]): r["seeds"] for r in result["compact"]}
    cells: dict[tuple[str, str, str], int] = {}
    for run in design:
        cells[(run.task, run.base, run.method)] = cells.get((run.task, run.base, run.method), 0) + 1
    short = [
        f"{b} {LABELS[m]} {have.get((t, b, m), 0)}/{n}" for (t, b, m), n in cells.items() if have.get((t, b, m), 0) < n
    ]
    lines = [
        f"- Not in the tables yet (seeds present / designed): {', '.join(short)}."
        if short
        else f"- Every run of the design grid ({len(design)} RL runs) is in the tables."
    ]
    runs = {k: v for k, v in seconds.items() if not k.endswith("__s-1")}
    if runs:
        total, mean = sum(runs.values()), sum(runs.values()) / len(runs)
        lines.append(
            f"- Measured wall time (scripts/forking/results/run_seconds.json, 1 thread per run): {len(runs)} RL runs, "
            f"{total:.0f} run-seconds in total (mean {mean:.0f} s), i.e. about {total / 2 / 3600:.1f} h on 2 cores in "
            f"2 shards; the full design grid ({len(design)} runs) at that mean: about "
            f"{len(design) * mean / 2 / 3600:.1f} h."
        )
    return lines


def readme_block(result: dict[str, Any], fs: Any, seconds: dict[str, float]) -> str:
    """The README / report block: the headline table next to the paper's numbers and the generated answers."""
    pk = f"pass@{result['k_primary']}"
    ak = f"avg@{result['k_primary']}"
    lines = [
        f"Test split, T = {fs.PRIMARY_T}, last step, class-weighted, mean over RL seeds; differences against GRPO "
        "are paired by seed with 95 % bootstrap intervals over seeds and prompts (generated by "
        "`scripts/studies/forking/analysis.py` from the committed `eval.parquet` / `train.parquet`; "
        "do not edit by hand).",
        "",
        f"| base | method | seeds | {ak} | {pk} | {pk} - GRPO | {ak} - GRPO | {ak} up & {pk} down vs base |",
        "|---|---|---|---|---|---|---|---|",
        *_headline_rows(result, fs),
        PAPER_ROW,
        "",
        *_answers(result, fs, pk),
        *_coverage(result, fs, seconds),
    ]
    return "\n".join(lines) + "\n"


def replace_block(path: Path, marker: str, block: str) -> bool:
    """Replace the text between ``<!-- {marker}:start -->`` and ``<!-- {marker}:end -->`` in ``path`` with
    ``block``; True if the file changed. Raises if the markers are missing."""
    text = Path(path).read_text()
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    i, j = text.find(start), text.find(end)
    if i < 0 or j < i:
        raise ValueError(f"{path} has no '{start.strip()}' ... '{end}' block")
    new = text[: i + len(start)] + block + text[j:]
    Path(path).write_text(new)
    return new != text


def read_block(path: Path, marker: str) -> str:
    """The text between the ``marker`` start and end comments of ``path``."""
    text = Path(path).read_text()
    start, end = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
    return text[text.index(start) + len(start) : text.index(end)]

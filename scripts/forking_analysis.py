"""Analysis of the forking study: reads only ``eval.csv`` and ``train.csv`` and writes the summary and plots.

    python scripts/forking_study.py --analyze --out scripts/forking/results

Writes ``summary.json`` (every number the report quotes), ``summary.md`` (tables) and the PNG plots into the
study directory. The endpoints and the bootstrap are defined in ``forking_study.py`` (fixed before the runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from lit_entropy.data.forking import CLASS_PROBS, STRATEGIES

__all__ = ["analyze", "paired_bootstrap", "per_prompt_metric"]

WEIGHTS = {"forking": dict(zip(STRATEGIES, CLASS_PROBS, strict=True)), "chain": {"chain": 1.0}}


def _settings():
    import forking_study as fs

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
) -> tuple[float, float, float]:
    """Mean over seeds of the class-weighted mean of ``diff`` [seeds, prompts], and a 95 % percentile interval.

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
    lo, hi = np.percentile(stats, [2.5, 97.5])
    return point, float(lo), float(hi)


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


def analyze(out: Path) -> dict[str, Any]:
    """Write summary.json, summary.md and the plots of the study in ``out``."""
    fs = _settings()
    out = Path(out)
    ev = pd.read_csv(out / "eval.csv")
    tr = pd.read_csv(out / "train.csv") if (out / "train.csv").exists() else pd.DataFrame()
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
    result["phenomenon"] = phen

    # 2. Paired differences against GRPO with bootstrap intervals over seeds and prompts.
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
    result["paired_vs_grpo"] = paired
    if not tr.empty:
        cols = [c for c in tr.columns if c.startswith(("entropy_", "masked"))]
        result["train_means"] = (
            tr.groupby(["task", "base", "method"])[cols].mean().reset_index().to_dict(orient="records")
        )
    result["compact"] = _compact(summ, paired, fs, pk)
    (out / "summary.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (out / "summary.md").write_text(_markdown(result, summ, fs))
    _plots(out, summ, tr, pd.DataFrame(paired), fs)
    return result


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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = [m for m in fs.METHODS if m in set(summ["method"])]
    colors = {m: f"C{i}" for i, m in enumerate(["base", *fs.METHODS])}
    fork = summ[summ["task"] == "forking"]
    # Entropy over steps: strategy token vs the rest.
    if not tr.empty:
        t = tr[tr["task"] == "forking"]
        fig, axes = plt.subplots(1, 3, figsize=(15, 4))
        for m in methods:
            g = t[t["method"] == m].groupby("step")
            for ax, col in zip(axes[:2], ("entropy_strategy", "entropy_rest"), strict=True):
                mean, sd = g[col].mean(), g[col].std().fillna(0)
                ax.plot(mean.index, mean, color=colors[m], label=m)
                ax.fill_between(mean.index, mean - sd, mean + sd, color=colors[m], alpha=0.15)
        for ax, title in zip(axes[:2], ("strategy token (response position 0)", "rest of the response"), strict=True):
            ax.set(title=f"entropy (nats), {title}", xlabel="step")
        axes[0].legend(fontsize=8)
        # Masked share by token role.
        means = t.groupby("method")[["masked_strategy", "masked_rest", "masked_neg_strategy", "masked_neg_rest"]].mean()
        means = means.reindex([m for m in methods if m in means.index])
        x = np.arange(len(means))
        for i, col in enumerate(means.columns):
            axes[2].bar(x + 0.2 * i - 0.3, means[col], width=0.2, label=col)
        axes[2].set_xticks(x, means.index, rotation=30, fontsize=8)
        axes[2].set(title="masked share by token role (mean over steps)", yscale="symlog", ylabel="share")
        axes[2].set_yscale("symlog", linthresh=1e-4)
        axes[2].set_ylim(0, 1.5)
        axes[2].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "entropy_and_masking.png", dpi=90)
        plt.close(fig)
    # pass@k curves per class, last step (base = step 0), both temperatures, per base model.
    for base in sorted(set(fork["base"])):
        fig, axes = plt.subplots(2, 4, figsize=(16, 7), sharey=True)
        fb = fork[fork["base"] == base]
        last = fb[fb["step"] == fb.groupby(["method", "seed"])["step"].transform("max")]
        for row, temp in enumerate(fs.TEMPERATURES):
            for col, cls in enumerate(STRATEGIES):
                ax = axes[row, col]
                for m in ["base", *methods]:
                    g = last[(last["method"] == m) & np.isclose(last["temperature"], temp)]
                    if g.empty:
                        continue
                    ks = list(fs.KS)
                    ax.plot(ks, [g[f"pass@{k}_{cls}"].mean() for k in ks], marker=".", color=colors[m], label=m)
                ax.set(xscale="log", title=f"class {cls}, T={temp}", xlabel="k")
        axes[0, 0].set_ylabel("pass@k (test, last step)")
        axes[0, 0].legend(fontsize=7)
        fig.suptitle(f"{base}: pass@k per class (mean over seeds; avg@K = pass@1)")
        fig.tight_layout()
        fig.savefig(out / f"pass_at_k_{base}.png", dpi=90)
        plt.close(fig)
    # Paired differences against GRPO.
    if not paired.empty:
        sel = paired[paired["task"] == "forking"]
        panels = sorted(set(zip(sel["endpoint"], sel["metric"], strict=True)))
        fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(4 * max(len(panels), 1), 4), squeeze=False)
        for ax, (endpoint, metric) in zip(axes[0], panels, strict=False):
            g = sel[(sel["endpoint"] == endpoint) & (sel["metric"] == metric)].reset_index(drop=True)
            labels = [f"{r.method}\n{r.base}" for r in g.itertuples()]
            ax.errorbar(g["diff"], np.arange(len(g)), xerr=[g["diff"] - g["lo"], g["hi"] - g["diff"]], fmt="o")
            ax.axvline(0, color="k", lw=0.8)
            ax.set_yticks(np.arange(len(g)), labels, fontsize=7)
            ax.set(title=f"{metric}, {endpoint}\nminus GRPO (95% CI)")
        fig.tight_layout()
        fig.savefig(out / "paired_vs_grpo.png", dpi=90)
        plt.close(fig)

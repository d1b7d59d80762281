"""Figures and the summary table of the agent demonstrations, from ``docs/figures/agents_demos*.parquet``
(written by ``python -m scripts.demos.agents evaluate``)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

__all__ = ["summary_table", "write_figures"]

#: Metrics of each task's start / end panels, in order, with their axis labels.
PANELS = {
    "calculator": (("tool_use_rate", "tool-use rate"), ("accuracy", "accuracy (exact answer)")),
    "guessing": (("mean_reward", "mean reward (solved + speed bonus)"), ("mean_turns", "guesses per game")),
}
#: Training curve of each task.
CURVE = {"calculator": "train/reward/mean", "guessing": "train/reward/mean"}
ARM_COLOURS = {"grpo": "tab:blue", "clip_b": "tab:orange", "clip_v": "tab:green"}


def summary_table(results: pd.DataFrame) -> str:
    """Markdown: per task, arm and metric, start and end as mean ± standard deviation over seeds, and each seed's."""
    lines = ["| task | arm | metric | start | end | per seed (start → end) |", "|---|---|---|---|---|---|"]
    for (task, arm, metric), group in results.groupby(["task", "arm", "metric"], sort=False):
        wide = group.pivot_table(index="seed", columns="stage", values="value")
        cells = [f"{_mean_sd(wide['start'])}", f"{_mean_sd(wide['end'])}"]
        seeds = ", ".join(f"s{s}: {r['start']:.2f} → {r['end']:.2f}" for s, r in wide.iterrows())
        lines.append(f"| {task} | {arm} | {metric} | {cells[0]} | {cells[1]} | {seeds} |")
    return "\n".join(lines)


def _mean_sd(values: pd.Series) -> str:
    sd = values.std(ddof=1) if len(values) > 1 else 0.0
    return f"{values.mean():.3f} ± {sd:.3f}"


def write_figures(results_path: Path, curves_path: Path, out_dir: Path) -> list[Path]:
    """One PNG per task (start → end per seed and arm, then the training reward curve); prints the table."""
    results = pd.read_parquet(results_path)
    curves = pd.read_parquet(curves_path)
    written = []
    for task, metrics in PANELS.items():
        task_rows = results[results.task == task]
        if task_rows.empty:
            continue
        arms = list(dict.fromkeys(task_rows.arm))
        fig, axes = plt.subplots(1, len(metrics) + 1, figsize=(4.2 * (len(metrics) + 1), 3.6))
        for ax, (metric, label) in zip(axes, metrics, strict=False):
            for i, arm in enumerate(arms):
                wide = task_rows[(task_rows.arm == arm) & (task_rows.metric == metric)].pivot_table(
                    index="seed", columns="stage", values="value"
                )
                x = [2 * i, 2 * i + 1]
                for _, r in wide.iterrows():
                    ax.plot(x, [r["start"], r["end"]], "-o", color=ARM_COLOURS[arm], alpha=0.5, ms=3)
                ax.errorbar([x[1] + 0.15], [wide["end"].mean()], yerr=[wide["end"].std(ddof=1)], fmt="s",
                            color=ARM_COLOURS[arm], capsize=3)  # fmt: skip
            ax.set_xticks([2 * i + k for i in range(len(arms)) for k in (0, 1)])
            ax.set_xticklabels([f"{arm}\n{s}" for arm in arms for s in ("start", "end")], fontsize=7)
            ax.set_ylabel(label)
            ax.grid(alpha=0.3)
        ax = axes[-1]
        for arm in arms:
            c = curves[(curves.task == task) & (curves.arm == arm) & (curves.tag == CURVE[task])]
            if c.empty:
                continue
            stats = c.groupby("step")["value"].agg(["mean", "min", "max"])
            smooth = stats.rolling(5, min_periods=1).mean()
            ax.plot(smooth.index, smooth["mean"], color=ARM_COLOURS[arm], label=arm)
            ax.fill_between(smooth.index, smooth["min"], smooth["max"], color=ARM_COLOURS[arm], alpha=0.15)
        ax.set_xlabel("training step")
        ax.set_ylabel("train reward, 5-step mean (band: seeds)")
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        seeds = task_rows.seed.nunique()
        fig.suptitle(f"{task}: start (base model) → end, {seeds} seeds per arm; held-out problems, T = 1", fontsize=9)
        fig.tight_layout()
        path = out_dir / f"agents_{task}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
        print(f"wrote {path}")
    print(summary_table(results))
    return written

"""The key curves of one run as the Markdown table docs/study.md shows: values at chosen steps, and the best one.

    lit-entropy fit --config configs/grpo_tiny.yaml
    python -m scripts.docs.run_summary runs/grpo_tiny/version_0 --steps 0 60 270

Reads the run's TensorBoard event files (the training run's own, not its ``validate_step_*`` runs). A value is
the one logged at that step, or, for a step that tag was not logged at, the last one before it; training
scalars of batch i sit at step i, so the last training batch of a 270-batch run is at step 269.
"""

from __future__ import annotations

import argparse
from pathlib import Path

TAGS = ("val/avg@8", "val/pass@8", "train/entropy/mean", "train/reward/mean")
BEST = ("val/avg@8", "val/pass@8")


def read_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files directly in ``run_dir``: tag -> [(step, value)] in step order."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: sorted((e.step, e.value) for e in events.Scalars(tag)) for tag in events.Tags()["scalars"]}


def value_at(points: list[tuple[int, float]], step: int) -> float | None:
    """The value logged at ``step``, else the last one before it; None when the tag starts later."""
    before = [value for at, value in points if at <= step]
    return before[-1] if before else None


def summary_table(scalars: dict[str, list[tuple[int, float]]], steps: list[int], tags=TAGS) -> str:
    """Markdown: one row per tag present, one column per step (``best`` appended for the validation tags)."""
    lines = ["| | " + " | ".join(f"step {step}" for step in steps) + " |", "|---|" + "---|" * len(steps)]
    for tag in tags:
        if tag not in scalars:
            continue
        cells = []
        for step in steps:
            value = value_at(scalars[tag], step)
            cells.append("" if value is None else f"{value:.3f}")
        if tag in BEST:
            best = max(value for _, value in scalars[tag])
            cells[-1] += f" (best {best:.3f})"
        lines.append(f"| `{tag}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path, help="a run directory, e.g. runs/grpo_tiny/version_0")
    parser.add_argument("--steps", type=int, nargs="+", default=[0, 60, 270], help="columns of the table")
    args = parser.parse_args(argv)
    print(summary_table(read_scalars(args.run_dir), args.steps), end="")


if __name__ == "__main__":
    main()

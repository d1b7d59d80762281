"""Issue 35 §9: one event stream per run; an exact resume gives TensorBoard nothing to purge."""

from __future__ import annotations

import logging
from pathlib import Path

from lit_entropy.cli import cli_main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
SHORT = [
    "--trainer.enable_progress_bar=false",
    "--trainer.val_check_interval=2",
    "--data.num_train_examples=64",
    "--data.num_val_examples=8",
    "--data.val_batch_size=8",
]


def _tags_by_file(run: Path) -> list[dict[str, list[int]]]:
    """For each event file of ``run`` (oldest first): tag -> the steps it holds, read raw (no purging)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out = []
    for path in sorted(run.glob("events.out.tfevents.*"), key=lambda p: int(p.name.split(".")[3])):
        tags: dict[str, list[int]] = {}
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                tags.setdefault(value.tag, []).append(int(event.step))
        out.append(tags)
    return out


def test_the_step_0_validation_and_training_share_one_event_file_and_an_exact_resume_purges_nothing(
    tmp_path, monkeypatch, caplog
):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    cli_main(["fit", "--config", str(GRPO_TINY), *SHORT, "--trainer.max_steps=4"])
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    (only,) = _tags_by_file(run)  # one file: the step-0 validation is in the training's stream
    assert only["val/avg@8"] == [0, 2, 4] and only["train/reward/mean"] == [0, 1, 2, 3]

    checkpoint = run / "checkpoints" / "last.ckpt"
    cli_main(
        ["fit", "--config", str(run / "config.yaml"), *SHORT[:1], f"--ckpt_path={checkpoint}", "--trainer.max_steps=6"]
    )
    first, resumed = _tags_by_file(run)
    assert resumed["train/reward/mean"] == [4, 5] and resumed["val/avg@8"] == [6]  # step 4's validation not repeated
    with caplog.at_level(logging.WARNING, logger="tensorboard"):
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
    assert not [r for r in caplog.records if "Purging" in r.getMessage()]
    assert [e.step for e in events.Scalars("val/avg@8")] == [0, 2, 4, 6]
    assert [e.step for e in events.Scalars("train/reward/mean")] == [0, 1, 2, 3, 4, 5]

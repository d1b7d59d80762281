"""Smoke test: the agent demonstrations' configs train a couple of steps from the command line, their
multi-turn metrics logged (the learning runs themselves: docs/agents_demos.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_entropy.cli import cli_main

REPO = Path(__file__).resolve().parents[2]
# A couple of small steps: 2 prompts x 2 samples, one validation batch of 2 prompts (num_val_examples does not cut a
# function's rows, limit_val_batches does).
SMALL = [
    "--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.enable_checkpointing=false",
    "--data.batch_size=2", "--model.sampling.num_samples=2", "--data.num_val_examples=2", "--data.val_batch_size=2",
    "--model.evaluation.num_samples=2", "--trainer.limit_val_batches=1", "--model.logging.export_on_train_end=false",
]  # fmt: skip


@pytest.mark.parametrize("config", ["calculator_tools.yaml", "calculator_tools_clip_b.yaml", "guessing_game.yaml"])
def test_a_demo_config_trains_two_steps(config, tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415 - slow import

    monkeypatch.chdir(REPO)  # the configs name their base models relative to the repository root
    cli_main(["fit", "--config", f"configs/{config}", *SMALL, f"--trainer.logger.init_args.save_dir={tmp_path}"])
    (run,) = [p.parent for p in tmp_path.rglob("events.out.tfevents.*")]
    events = EventAccumulator(str(run))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"train/multi_turn/turns", "train/multi_turn/tool_calls", "train/reward/mean"} <= tags
    steps = [e.step for e in events.Scalars("train/multi_turn/turns")]
    assert len(steps) == 2
    turns = [e.value for e in events.Scalars("train/multi_turn/turns")]
    assert all(1 <= t <= (2 if "calculator" in config else 6) for t in turns)

"""Exact resume of a multi-turn run: stopped after a step, or interrupted inside a multi-turn rollout, and resumed
from its checkpoint, it ends with the uninterrupted run's weights, bit for bit.

The run plays the guessing game (a text environment whose state, the hidden number and the turns taken, lives in one
instance per trajectory) with the demo's SFT base model, so trajectories take several turns."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.assets import TINY_MODEL_DIR
from lit_entropy.checkpointing import RunInterrupted
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import HFRolloutEngine
from lit_entropy.settings import EvaluationConfig, LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig

BATCHES, STOP_AFTER = 4, 2
ENVIRONMENT = {"class_path": "lit_entropy.environments.guessing_game.GuessingGame", "init_args": {"max_turns": 4}}


class Recorder(Callback):
    """Per batch (1-based): the ``train/*`` values and the global step."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, float]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        row = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
        self.rows[batch_idx + 1] = {**row, "global_step": float(trainer.global_step)}


class StopAfter(Callback):
    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == self.batches:
            trainer.should_stop = True


class InterruptInRound(HFRolloutEngine):
    """HF sampling that raises KeyboardInterrupt (Ctrl-C) in round ``round`` of training rollout ``rollout``: in the
    middle of a multi-turn rollout, its earlier rounds' environments already stepped."""

    def __init__(self, rollout: int, round: int) -> None:
        super().__init__()
        self.rollout, self.round, self.calls = rollout, round, 0

    def generate(self, policy, input_ids, attention_mask, sampling):
        if policy.training:
            self.calls += 1
            if self.calls == (self.rollout - 1) * 4 + self.round:  # <= 4 rounds (max_turns) per rollout
                raise KeyboardInterrupt
        return super().generate(policy, input_ids, attention_mask, sampling)


def _fit(root: Path, *, ckpt_path=None, callbacks=(), rollout=None):
    seed_everything(0)
    model = str(TINY_MODEL_DIR.with_name("tiny-qwen2-guess"))
    module = RFTModule(
        PolicyConfig(model),
        sampling=TrainingSamplingConfig(
            num_samples=8, max_new_tokens=48, multi_turn=MultiTurnConfig(environment=ENVIRONMENT, max_turns=4)
        ),
        optim=OptimConfig(lr=3e-3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
        rollout=rollout,
    )
    data = PromptDataModule(
        tokenizer_name_or_path=model, train_dataset="lit_entropy.environments.guessing_game:train_rows",
        val_dataset="lit_entropy.environments.guessing_game:validation_rows", apply_chat_template=True, batch_size=2,
        num_train_examples=32, seed=3,
    )  # fmt: skip
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES, limit_val_batches=1,
        val_check_interval=STOP_AFTER, logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks), enable_progress_bar=False,
        enable_model_summary=False, default_root_dir=root, callbacks=[recorder, *callbacks],
    )  # fmt: skip
    trainer.fit(module, data, ckpt_path=ckpt_path)
    weights = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
    return weights, recorder.rows, trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    weights, rows, trainer = _fit(tmp_path_factory.mktemp("full"))
    assert trainer.global_step == BATCHES
    return weights, rows


def _assert_same_tail(rows, reference) -> None:
    assert sorted(rows) == list(range(STOP_AFTER + 1, BATCHES + 1))
    for batch, row in rows.items():
        assert row.keys() == reference[batch].keys()
        for key, value in reference[batch].items():
            assert row[key] == pytest.approx(value, rel=1e-6, abs=1e-7), (batch, key)


def test_a_stopped_multi_turn_run_resumes_exactly(tmp_path, uninterrupted):
    weights, reference = uninterrupted
    # the run is multi-turn, not trivial: several turns per trajectory, rewards that vary, an environment reward
    assert all(row["train/multi_turn/turns"] > 1.5 for row in reference.values())
    assert sum(row["train/reward/std"] > 0 for row in reference.values()) >= BATCHES - 1
    assert any(row["train/multi_turn/environment_reward"] > 0 for row in reference.values())

    every = ModelCheckpoint(tmp_path / "a", filename="stopped", every_n_train_steps=STOP_AFTER)
    _, first, _ = _fit(tmp_path / "a", callbacks=[every, StopAfter(STOP_AFTER)])
    assert first[STOP_AFTER] == pytest.approx(reference[STOP_AFTER])
    resumed_weights, resumed, trainer = _fit(tmp_path / "b", ckpt_path=tmp_path / "a" / "stopped.ckpt")
    assert trainer.global_step == BATCHES
    _assert_same_tail(resumed, reference)
    torch.testing.assert_close(resumed_weights, weights, rtol=0, atol=0)


def test_ctrl_c_inside_a_multi_turn_rollout_resumes_exactly(tmp_path, uninterrupted):
    """Ctrl-C in the second round of batch 2's rollout: the interrupt checkpoint is of step 1; the resumed run
    rolls batch 2 out again from its first round and matches the uninterrupted run."""
    weights, reference = uninterrupted
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises((SystemExit, RunInterrupted)):
            _fit(tmp_path / "run", rollout=InterruptInRound(rollout=STOP_AFTER + 1, round=2))
    finally:
        signal.signal(signal.SIGINT, previous)  # Lightning ignores SIGINT after the first one
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    assert path.is_file()
    assert torch.load(path, weights_only=True)["global_step"] == STOP_AFTER
    resumed_weights, resumed, trainer = _fit(tmp_path / "resume", ckpt_path=path)
    assert trainer.global_step == BATCHES
    _assert_same_tail(resumed, reference)
    torch.testing.assert_close(resumed_weights, weights, rtol=0, atol=0)

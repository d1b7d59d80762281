"""Exact resume in the middle of a DAPO dynamic-sampling fill: a SIGTERM during a refill (a generation batch that
does not finish its fill) writes a checkpoint holding the partial fill, and the resumed run ends with the weights
of the uninterrupted run; so does a Ctrl-C inside the generation batch that finishes a fill."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from transformers import AutoTokenizer

from lit_entropy.checkpointing import RunInterrupted
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import HFRolloutEngine
from lit_entropy.settings import (
    EvaluationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    TrainingSamplingConfig,
    UpdateConfig,
)

BATCHES = 9  # generation batches of the whole run


def odd_answer_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1 for a completion of odd length to a prompt with an odd answer, else 0: even-answer groups are always
    dropped, odd-answer ones kept when their samples' lengths disagree (random: fills take 1 to 3 generations)."""
    return [float(len(c) % 2 == 1 and int(a) % 2 == 1) for c, a in zip(completions, answers, strict=True)]


class Steps(Callback):
    """``global_step`` after each generation batch (by its index from the run's start)."""

    def __init__(self) -> None:
        self.steps: dict[int, int] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.steps[batch_idx] = trainer.global_step


class Interrupting(HFRolloutEngine):
    """HF sampling that, on the ``at``-th training rollout, sends SIGTERM (then samples) or raises Ctrl-C."""

    def __init__(self, at: int, how: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at, self.how, self.calls = at, how, 0

    def generate(self, policy, input_ids, attention_mask, sampling):
        self.calls += policy.training
        if policy.training and self.calls == self.at:
            if self.how == "ctrl_c":
                raise KeyboardInterrupt
            signal.raise_signal(signal.SIGTERM)
        return super().generate(policy, input_ids, attention_mask, sampling)


def _module(model_dir: str, rollout=None) -> RFTModule:
    module = RFTModule(
        PolicyConfig(model_dir),
        sampling=TrainingSamplingConfig(num_samples=4, max_new_tokens=4, filter_groups=True, max_gen_batches=3),
        update=UpdateConfig(epochs=2, mini_batch_size=8),
        optim=OptimConfig(lr=1e-2, lr_schedule="cosine", warmup_steps=3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
        rollout=rollout,
    )
    module.reward_fn = odd_answer_reward
    return module


def _fit(model_dir: str, root: Path, module: RFTModule | None = None, ckpt_path=None):
    seed_everything(0)
    module = module or _module(model_dir)
    steps = Steps()
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=4, num_train_examples=64, seed=3)
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES, limit_val_batches=1, val_check_interval=4,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=root, callbacks=[steps],
    )  # fmt: skip
    try:
        trainer.fit(module, data, ckpt_path=ckpt_path)
    except RunInterrupted as stop:  # a signal: the checkpoint is written, no validation or export follows
        trainer.interruption = stop
    return module, trainer, steps.steps


def _weights(module: RFTModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    module, trainer, steps = _fit(tiny_model_dir, tmp_path_factory.mktemp("full"))
    updates = [b for b in range(BATCHES) if steps[b] > steps.get(b - 1, 0)]
    refills = [b for b in range(1, BATCHES) if b not in updates and b - 1 not in updates and b > updates[0]]
    assert refills and any(b - 1 not in updates for b in updates[1:]), f"fills of 2+ generations: updates {updates}"
    return _weights(module), trainer.global_step, updates, refills


def _engine(model_dir: str, at: int, how: str) -> Interrupting:
    tok = AutoTokenizer.from_pretrained(model_dir)
    return Interrupting(at, how, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def test_sigterm_during_a_refill_resumes_to_the_uninterrupted_weights(tiny_model_dir, tmp_path, uninterrupted):
    weights, final_step, updates, refills = uninterrupted
    batch = refills[0]  # the second (or later) generation of a fill, after at least one update
    previous = signal.getsignal(signal.SIGTERM)
    module = _module(tiny_model_dir, _engine(tiny_model_dir, batch + 1, "sigterm"))
    _, trainer, steps = _fit(tiny_model_dir, tmp_path / "run", module)
    assert signal.getsignal(signal.SIGTERM) == previous
    assert max(steps) == batch, "stopped at the end of the signalled generation batch"
    assert trainer.interruption.code == 143
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    fill = torch.load(path, weights_only=True)["lit_entropy_group_fill"]
    assert len(fill) == 1 and fill[0]["gen_batches"] >= 2, "the checkpoint holds a fill of 2+ generation batches"
    module, trainer, _ = _fit(tiny_model_dir, tmp_path / "resume", ckpt_path=path)
    assert trainer.global_step == final_step
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)


def test_ctrl_c_in_the_batch_that_finishes_a_fill_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted):
    weights, final_step, updates, _ = uninterrupted
    batch = next(b for b in updates[1:] if b - 1 not in updates)  # finishes a fill of 2+ generations
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning exits after a graceful shutdown on KeyboardInterrupt
            module = _module(tiny_model_dir, _engine(tiny_model_dir, batch + 1, "ctrl_c"))
            _fit(tiny_model_dir, tmp_path / "run", module)
    finally:
        signal.signal(signal.SIGINT, previous)
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    module, trainer, steps = _fit(tiny_model_dir, tmp_path / "resume", ckpt_path=path)
    assert min(steps) == batch, "the interrupted generation batch is redone"
    assert trainer.global_step == final_step
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)

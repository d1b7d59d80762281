"""``model.sampling.async_rollout`` in a fit: staleness 0 is the synchronous run, stale batches within the bound and
corrected, a failing or hung worker stops the run with its own error, and a resumed run trains every prompt once."""

from __future__ import annotations

import os
import signal
import threading
import warnings
from pathlib import Path

import pytest
import torch
from _trained_prompts import TrainedPrompts
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from safetensors.torch import load_file

from lit_entropy.async_rollout import AsyncRolloutConfig, RolloutWorkerError, RolloutWorkerHung
from lit_entropy.checkpointing import RunInterrupted
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import HFRolloutEngine
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig, UpdateConfig

ROOT = Path(__file__).resolve().parents[2]
# The tiny random-init model starts near ln V, where the policy-health check warns of uniform sampling.
pytestmark = [
    pytest.mark.filterwarnings("ignore:lit_entropy. the policy samples uniformly"),
    # Runs limited by limit_train_batches end with batches in flight (test_the_end_of_the_last_epoch_... checks it).
    pytest.mark.filterwarnings("ignore:lit_entropy. the run ran out of data"),
]


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class SigtermAt(Callback):
    """Sends SIGTERM to this process (as a scheduler would) at the start of training batch ``at`` (0-based)."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if batch_idx == self.at:
            os.kill(os.getpid(), signal.SIGTERM)


def _module(model_dir: str, async_rollout=None, **extra) -> RFTModule:
    module = RFTModule(
        PolicyConfig(model_dir),
        sampling=TrainingSamplingConfig(num_samples=4, max_new_tokens=4, async_rollout=async_rollout),
        update=UpdateConfig(epochs=1, mini_batch_size=16),
        optim=OptimConfig(lr=1e-2),
        logging=LoggingConfig(export_on_train_end=False),
        **extra,
    )
    module.reward_fn = digit_reward
    return module


def _fit(module, root: Path, *, batches: int, callbacks=(), ckpt_path=None, max_steps=-1):
    seed_everything(0)
    data = PromptDataModule(
        tokenizer_name_or_path=module.model_name_or_path, batch_size=4, num_train_examples=64, seed=3
    )
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, max_steps=max_steps, limit_train_batches=batches, limit_val_batches=0,
        logger=False, enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=root, callbacks=list(callbacks),
    )  # fmt: skip
    try:
        trainer.fit(module, data, ckpt_path=ckpt_path)
    except RunInterrupted as stop:
        trainer.interruption = stop
    return trainer


def _weights(module: RFTModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


def test_staleness_zero_reproduces_the_synchronous_default_bit_for_bit(tmp_path, monkeypatch):
    """The embedded default (configs/grpo_tiny.yaml) for 3 steps, synchronous and with max_staleness 0: the same
    exported weights, bit for bit (the worker thread samples from its copy in the trainer's RNG order)."""
    from lit_entropy.cli import cli_main

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    exported = {}
    for name, extra in (("sync", []), ("async0", ["--model.sampling.async_rollout.max_staleness=0"])):
        cli_main([
            "fit", "--config", str(ROOT / "configs" / "grpo_tiny.yaml"), "--trainer.max_steps=3",
            "--trainer.enable_checkpointing=false", "--trainer.limit_val_batches=0",
            "--trainer.enable_progress_bar=false", f"--trainer.logger.init_args.save_dir={tmp_path / name}", *extra,
        ])  # fmt: skip
        (model,) = (tmp_path / name).glob("*/version_0/hf_model/model.safetensors")
        exported[name] = load_file(model)
    assert exported["sync"].keys() == exported["async0"].keys()
    for key, tensor in exported["sync"].items():
        assert torch.equal(tensor, exported["async0"][key]), key
    initial = load_file(str(ROOT / "lit_entropy" / "assets" / "tiny-qwen2-arith" / "model.safetensors"))
    assert any(not torch.equal(initial[k], exported["sync"][k]) for k in initial if k in exported["sync"])  # it trained


def test_one_step_off_policy_trains_each_prompt_once_one_version_late_and_corrected(tiny_model_dir, tmp_path):
    module = _module(tiny_model_dir, AsyncRolloutConfig(max_staleness=1))
    assert module.settings.loss.rollout_correction.level == "token"  # on by default for stale samples
    record = TrainedPrompts()
    trainer = _fit(module, tmp_path, batches=5, callbacks=[record])
    sync_record = TrainedPrompts()
    _fit(_module(tiny_model_dir), tmp_path / "sync", batches=5, callbacks=[sync_record])
    # The first batch only fills the queue; then each step trains the batch sent one step earlier.
    assert trainer.global_step == 4 and record.prompts == sync_record.prompts[: 4 * 4]
    assert record.metrics[0] == {}
    assert [m["train/async/staleness_max"] for m in record.metrics[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert [m["train/async/version"] for m in record.metrics[1:]] == [0.0, 0.0, 1.0, 2.0]
    assert all(m["train/async/queue_depth"] == 1.0 for m in record.metrics[1:])
    assert module.rollouts.worker is None  # closed at teardown


class FailingEngine(HFRolloutEngine):
    """HF sampling whose ``at``-th call raises, or hangs when ``hang``."""

    def __init__(self, at: int, hang: bool = False) -> None:
        super().__init__()
        self.at, self.hang, self.calls = at, hang, 0
        self.release = threading.Event()

    def generate(self, policy, input_ids, attention_mask, sampling):
        self.calls += 1
        if self.calls == self.at:
            if self.hang:
                self.release.wait()
            else:
                raise OSError("the rollout engine lost its device")
        return super().generate(policy, input_ids, attention_mask, sampling)


@pytest.mark.parametrize("hang", [False, True], ids=["raises", "hangs"])
def test_a_failing_worker_stops_the_run_with_its_own_error_and_the_last_checkpoint_intact(
    tiny_model_dir, tmp_path, hang
):
    engine = FailingEngine(at=4, hang=hang)
    config = AsyncRolloutConfig(max_staleness=1, worker_timeout_s=2.0)
    module = _module(tiny_model_dir, config, rollout=engine)
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_last=True, save_top_k=-1)
    expected = (RolloutWorkerHung, "worker_timeout_s=2") if hang else (RolloutWorkerError, "lost its device")
    try:
        with pytest.raises(expected[0], match=expected[1]) as caught:
            _fit(module, tmp_path, batches=6, callbacks=[checkpoints])
    finally:
        engine.release.set()
    if hang:
        assert "release.wait" in str(caught.value)  # the worker's own stack
    else:
        assert isinstance(caught.value.__cause__, OSError)
    # Batch 4's rollout failed; step 5 needed it. Batch 1 only filled the queue, batches 1-3 were trained in steps
    # 2-4, whose checkpoints are whole: the last one holds batch 4's prompts, regenerated on resume.
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 3 and last["lit_entropy_async_rollout"][0]["version"] == 3
    assert len(last["lit_entropy_async_rollout"][0]["batches"]) == 1


def test_sigterm_with_a_full_queue_resumes_without_skipping_or_repeating_a_prompt(tiny_model_dir, tmp_path):
    config = AsyncRolloutConfig(max_staleness=2, max_inflight=2)
    whole = TrainedPrompts()
    _fit(_module(tiny_model_dir, config), tmp_path / "whole", batches=7, callbacks=[whole])
    assert len(whole.prompts) == 5 * 4  # two batches fill the queue

    first = TrainedPrompts()
    trainer = _fit(_module(tiny_model_dir, config), tmp_path / "run", batches=7, callbacks=[first, SigtermAt(3)])
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    assert trainer.interruption.path == path and trainer.global_step == 2
    saved = torch.load(path, weights_only=False)["lit_entropy_async_rollout"][0]
    assert len(saved["batches"]) == 2 and saved["version"] == 2  # the queue was full: two batches in flight
    second = TrainedPrompts()
    trainer = _fit(_module(tiny_model_dir, config), tmp_path / "resume", batches=7, callbacks=[second], ckpt_path=path)
    assert trainer.global_step == 5
    assert first.prompts + second.prompts == whole.prompts
    # The two regenerated batches and the next one were sampled with the resumed weights (version 2).
    assert [m["train/async/version"] for m in second.metrics] == [2.0, 2.0, 2.0]
    assert [m["train/async/staleness_max"] for m in second.metrics] == [0.0, 1.0, 2.0]


def test_the_async_tags_logged_are_the_ones_docs_dashboard_lists(tiny_model_dir, tmp_path):
    import re

    from lightning.pytorch.loggers import TensorBoardLogger

    from scripts.docs.run_summary import read_scalars

    module = _module(tiny_model_dir, AsyncRolloutConfig(max_staleness=2, max_inflight=2))
    seed_everything(0)
    data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=4, num_train_examples=64, seed=3)
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=5, limit_val_batches=0, enable_checkpointing=False,
        logger=TensorBoardLogger(tmp_path, name="run", default_hp_metric=False), log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, data)
    scalars = read_scalars(next(tmp_path.glob("run/version_0")))
    logged = {tag for tag in scalars if tag.startswith("train/async/")}
    documented = set(re.findall(r"^\| `(train/async/[a-z_]+)`", (ROOT / "docs" / "dashboard.md").read_text(), re.M))
    assert logged == documented
    assert [value for _, value in scalars["train/async/staleness_max"]] == [0.0, 1.0, 2.0]
    assert "train/rollout/frac_above" in scalars  # the correction this mode turns on logs its fractions


def test_the_end_of_the_last_epoch_warns_of_the_batches_in_flight_and_max_steps_trains_them(tiny_model_dir, tmp_path):
    """max_epochs=1 with one batch in flight: the last batch of the epoch was sent, not trained, and the run says so
    (naming the recipe); max_epochs=2 with max_steps = the epoch's batches trains every prompt of the epoch."""

    def fit(max_epochs: int, max_steps: int, record: TrainedPrompts) -> Trainer:
        seed_everything(0)
        data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=4, num_train_examples=16, seed=3)
        trainer = Trainer(
            accelerator="cpu", max_epochs=max_epochs, max_steps=max_steps, limit_val_batches=0, logger=False,
            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[record],
        )  # fmt: skip
        trainer.fit(_module(tiny_model_dir, AsyncRolloutConfig(max_staleness=1)), data)
        return trainer

    sync = TrainedPrompts()
    seed_everything(0)
    data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=4, num_train_examples=16, seed=3)
    Trainer(
        accelerator="cpu", max_epochs=1, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[sync],
    ).fit(_module(tiny_model_dir), data)  # fmt: skip
    assert len(sync.prompts) == 16  # the epoch: 4 batches of 4 prompts

    short = TrainedPrompts()
    with pytest.warns(UserWarning, match=r"max_epochs=1\) with 1 batch\(es\) \(4 prompts per rank\).*max_epochs=2 with "
                      r"trainer.max_steps=4 trains every prompt of 1 epoch"):  # fmt: skip
        trainer = fit(1, -1, short)
    assert trainer.global_step == 3 and short.prompts == sync.prompts[:12]

    whole = TrainedPrompts()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="lit_entropy. the run ran out of data")
        trainer = fit(2, 4, whole)
    assert trainer.global_step == 4 and whole.prompts == sync.prompts

"""``model.sampling.multi_turn`` with ``model.sampling.async_rollout``: the rollout worker runs the environment loop on
its own copy of the policy; at staleness 0 the run is the synchronous one bit for bit, at staleness 1 each batch trains
one version late."""

from __future__ import annotations

import torch
from lightning.pytorch import Trainer, seed_everything

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.assets import TINY_MODEL_DIR
from lit_entropy.async_rollout import AsyncRolloutConfig
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig
from tests._trained_prompts import TrainedPrompts

BATCHES = 3


class Record(TrainedPrompts):
    """The trained prompts and every ``train/*`` value after each batch."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.metrics.append({k: float(v) for k, v in metrics.items() if k.startswith("train/")})


def _fit(root, async_rollout=None):
    """The guessing game (its SFT base model plays several turns) for BATCHES batches of 2 prompts x 4 games."""
    seed_everything(0)
    model_dir = str(TINY_MODEL_DIR.with_name("tiny-qwen2-guess"))
    module = RFTModule(
        PolicyConfig(model_dir),
        sampling=TrainingSamplingConfig(
            num_samples=4,
            max_new_tokens=48,
            multi_turn=MultiTurnConfig(environment="lit_entropy.environments.guessing_game:GuessingGame", max_turns=6),
            async_rollout=async_rollout,
        ),
        optim=OptimConfig(lr=1e-2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    data = PromptDataModule(
        tokenizer_name_or_path=model_dir, train_dataset="lit_entropy.environments.guessing_game:train_rows",
        val_dataset=None, apply_chat_template=True, batch_size=2, num_train_examples=16, seed=3,
    )  # fmt: skip
    record = Record()
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=root,
        callbacks=[record],
    )  # fmt: skip
    trainer.fit(module, data)
    weights = {k: v.detach().clone() for k, v in module.policy.state_dict().items()}
    return trainer, record, weights


def test_staleness_zero_is_the_synchronous_multi_turn_run_bit_for_bit(tmp_path):
    torch.set_num_threads(1)
    _, sync_record, sync_weights = _fit(tmp_path / "sync")
    trainer, record, weights = _fit(tmp_path / "async0", AsyncRolloutConfig(max_staleness=0))
    assert trainer.global_step == BATCHES and record.prompts == sync_record.prompts
    assert all(m["train/multi_turn/turns"] > 1.5 for m in record.metrics)  # several turns per trajectory
    for got, want in zip(record.metrics, sync_record.metrics, strict=True):  # every value but timings and train/async
        kept = {k for k in want if not k.startswith(("train/time", "train/perf")) and not k.endswith("_s")}
        assert {k: got[k] for k in kept} == {k: want[k] for k in kept}
    for key, tensor in sync_weights.items():
        assert torch.equal(tensor, weights[key]), key


def test_staleness_one_trains_multi_turn_batches_one_version_late(tmp_path):
    trainer, record, _ = _fit(tmp_path, AsyncRolloutConfig(max_staleness=1))
    assert trainer.global_step == BATCHES - 1  # the first batch only fills the queue
    assert [m["train/async/staleness_max"] for m in record.metrics[1:]] == [0.0, 1.0]
    assert all(m["train/multi_turn/turns"] >= 1 for m in record.metrics[1:])

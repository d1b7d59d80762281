"""A short asynchronous GRPO fit on 2 gloo CPU ranks under DDP or FSDP2 (``--strategy fsdp2``), for
``test_async_ddp.py``.

Run as a script (Lightning's launcher re-executes it for rank 1), with the repository root and ``tests/`` on
``PYTHONPATH``::

    PYTHONPATH=.:tests python tests/async_rollout/_ddp_run.py --model DIR --out DIR

Each rank writes ``rank<R>.json``: the policy version of every batch it trained (``train/async/version``), the
prompts it trained, the engine-vs-trainer log-prob gap of every update, its final ``global_step`` and a checksum of
its final weights (FSDP2: rank 0 only), and ``checkpoint.json`` (rank
0): the prompts in flight per rank that the last checkpoint holds.
"""

from __future__ import annotations

import argparse
import json
import warnings
from pathlib import Path

import torch
from _trained_prompts import TrainedPrompts
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_entropy.async_rollout import AsyncRolloutConfig
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.distributed.fsdp2 import FSDP2Strategy, full_state_dict
from lit_entropy.module import RFTModule
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig, UpdateConfig

BATCHES = 5


class LogprobGaps(Callback):
    """``train/rollout/logprob_gap_mean`` (trainer vs engine log-probs) of every update."""

    def __init__(self) -> None:
        self.values: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if "train/rollout/logprob_gap_mean" in trainer.callback_metrics and trainer.global_step > len(self.values):
            self.values.append(float(trainer.callback_metrics["train/rollout/logprob_gap_mean"]))


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--strategy", choices=("ddp", "fsdp2"), default="ddp")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    seed_everything(0)
    module = RFTModule(
        PolicyConfig(args.model),
        sampling=TrainingSamplingConfig(
            num_samples=4, max_new_tokens=4, async_rollout=AsyncRolloutConfig(max_staleness=1)
        ),
        update=UpdateConfig(epochs=1, mini_batch_size=8),
        optim=OptimConfig(lr=1e-2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.reward_fn = digit_reward
    record = TrainedPrompts()
    out = Path(args.out)
    checkpoint = ModelCheckpoint(out, filename="last", every_n_train_steps=1)
    data = PromptDataModule(tokenizer_name_or_path=args.model, batch_size=2, num_train_examples=32, seed=3)
    strategy = FSDP2Strategy() if args.strategy == "fsdp2" else "ddp"
    gaps = LogprobGaps()
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy=strategy, max_epochs=1, limit_train_batches=BATCHES, limit_val_batches=0,
        logger=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=out,
        callbacks=[record, checkpoint, gaps],
    )  # fmt: skip
    trainer.fit(module, data)
    weights = float(sum(t.double().sum() for t in full_state_dict(module.policy).values()))  # collective (FSDP2)
    # From batch 1 on, as test_async_ddp.py reads them.
    versions = [m["train/async/version"] for m in record.metrics[1:] if "train/async/version" in m]
    info = {"versions": versions, "prompts": record.prompts, "global_step": trainer.global_step}
    info["weights"], info["gaps"] = weights, gaps.values
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(info))
    if trainer.global_rank == 0:
        saved = torch.load(out / "last.ckpt", weights_only=False)["lit_entropy_async_rollout"]
        held = [[prompt for batch in rank["batches"] for prompt in batch["prompts"]] for rank in saved]
        (out / "checkpoint.json").write_text(json.dumps({"in_flight": held, "versions": [r["version"] for r in saved]}))


if __name__ == "__main__":
    main()

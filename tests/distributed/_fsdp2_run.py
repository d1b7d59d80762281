"""A short GRPO fit for the FSDP2 equality test, single process or under ``ModelParallelStrategy``.

Run as a script (Lightning's launcher re-executes it once per extra rank)::

    python tests/_fsdp2_run.py --model DIR --out DIR --devices 2 --global-batch 4

Rank 0 writes ``metrics.json`` (logged ``train/*`` values per batch) and ``weights.pt`` (the full policy
state after training, gathered from the shards) into ``--out``; with ``--export`` the policy is also
exported to ``<out>/hf_model``. Rollouts come from :class:`SeededPolicySampler`, whose completions depend
only on the prompt, the sample index and the policy, never on the rank, the global RNG or how many calls
came before (a resumed run samples what the uninterrupted run sampled).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import Tensor, nn

from lit_entropy.callbacks import EntropyDiscriminatorClipping
from lit_entropy.checkpointing import RunInterrupted
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.distributed.fsdp2 import FSDP2Strategy, full_state_dict
from lit_entropy.module import RFTModule
from lit_entropy.rollout import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids
from lit_entropy.settings import (
    EvaluationConfig,
    LoggingConfig,
    LoraConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    TrainingSamplingConfig,
    UpdateConfig,
)

COMPARED = (
    "train/reward/mean",
    "train/length/mean",
    "train/reward/frac_zero_std",
    "train/update/advantage/std",
    "train/loss/policy",
    "train/loss/kl",
    "train/optim/grad_norm",
    "train/optim/lr",
    "train/entropy/mean",
    "train/entropy/kept",
    "train/clip/ratio",
    "train/clip/low",
    "train/clip/high",
    "train/entropy_clip/frac",
    "train/entropy_clip/frac_neg",
    "train/filter/gen_batches",
    "train/filter/groups_drawn",
    "train/filter/groups_kept",
    "train/filter/groups_trained",
)


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    """Varies across samples of a random tiny model, so advantages are not all zero."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class SeededPolicySampler(RolloutEngine):
    """Samples from the policy with one ``torch.Generator`` per row seeded by (prompt ids, sample index).

    Every call runs exactly ``max_new_tokens`` forward passes (no early stop), so FSDP2 ranks stay in step.
    """

    def __init__(self, eos_token_id: int, pad_token_id: int) -> None:
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    @torch.no_grad()
    def generate(self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig):
        k = sampling.num_samples
        ids = input_ids.repeat_interleave(k, 0)
        mask = attention_mask.repeat_interleave(k, 0)
        generators = []
        for row in range(ids.shape[0]):
            prompt = ids[row][mask[row].bool()].tolist()
            key = hashlib.sha256(repr((prompt, row % k)).encode()).digest()
            generators.append(torch.Generator().manual_seed(int.from_bytes(key[:8], "little")))
        was_training = policy.training
        policy.eval()
        try:
            for _ in range(sampling.max_new_tokens):
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = policy(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
                probs = torch.softmax(logits[:, -1].double() / sampling.temperature, -1)
                cdf = probs.cumsum(-1)
                u = torch.stack([torch.rand((), generator=g, dtype=torch.float64) for g in generators])
                nxt = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(-1)).clamp(max=probs.shape[-1] - 1)
                ids = torch.cat([ids, nxt], 1)
                mask = torch.cat([mask, torch.ones_like(nxt)], 1)
        finally:
            policy.train(was_training)
        responses = ids[:, input_ids.shape[1] :]
        response_mask = response_mask_from_ids(responses, self.eos_token_id)
        ids[:, input_ids.shape[1] :] = responses.masked_fill(~response_mask, self.pad_token_id)
        full_mask = torch.cat([attention_mask.repeat_interleave(k, 0), response_mask.long()], 1)
        return RolloutBatch(sequences=ids, attention_mask=full_mask, response_mask=response_mask)


def odd_answer_reward(completions: list[str], answers: list[str]) -> list[float]:
    """With 4 samples per prompt: sample 0 of a prompt with an odd answer is correct, every other sample wrong (a
    group is informative exactly when its answer is odd)."""
    return [float(int(a) % 2 == 1 and i % 4 == 0) for i, a in enumerate(answers)]


class Recorder(Callback):
    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.steps: list[int] = []  # global_step after each batch

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.rows.append({k: float(metrics[k]) for k in COMPARED if k in metrics})
        self.steps.append(trainer.global_step)


class InterruptRank1(Callback):
    """Sends SIGINT to rank 1 only, at the start of training batch ``batch``: the Ctrl-C of one process."""

    def __init__(self, batch: int) -> None:
        self.batch = batch

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if trainer.global_rank == 1 and batch_idx == self.batch:
            # raise(), not kill(getpid()): a process-directed signal may land on a gloo I/O thread; a
            # terminal's Ctrl-C reaches the main thread of each process, as this does.
            signal.raise_signal(signal.SIGINT)


def run(
    model: str,
    out: str,
    devices: int,
    global_batch: int,
    batches: int = 2,
    max_steps: int = -1,
    ckpt_path: str | None = None,
    sigint_rank1_batch: int | None = None,
    *,
    algorithm: str = "grpo",
    gradient_checkpointing: bool = False,
    fsdp_param_dtype: str | None = None,
    export_dir: str | None = None,
    max_tokens_per_micro_batch: int | None = None,
    filter_groups: bool = False,
    lora: bool = False,
) -> None:
    """Fit ``batches`` batches (or stop after ``max_steps`` updates, saving ``<out>/last.ckpt``); resume from
    ``ckpt_path`` when given."""
    torch.set_num_threads(1)
    seed_everything(0)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    module = RFTModule(
        PolicyConfig(
            model,
            gradient_checkpointing=gradient_checkpointing,
            fsdp_param_dtype=fsdp_param_dtype,
            lora=LoraConfig(r=4, alpha=8.0) if lora else None,  # KL reference: the adapters switched off
        ),
        algorithm=algorithm,
        sampling=TrainingSamplingConfig(
            num_samples=4, max_new_tokens=4, filter_groups=filter_groups, max_gen_batches=2
        ),
        loss=LossConfig(kl_coef=0.05),
        optim=OptimConfig(lr=1e-2, max_grad_norm=0.5),  # a small clip, so it acts on the (sharded) gradients
        evaluation=EvaluationConfig(num_samples=2),
        rollout=SeededPolicySampler(tok.eos_token_id, tok.pad_token_id),
        update=UpdateConfig(max_tokens_per_micro_batch=max_tokens_per_micro_batch),
        logging=LoggingConfig(export_on_train_end=export_dir is not None, export_dir=export_dir),
    )
    module.reward_fn = odd_answer_reward if filter_groups else digit_reward
    update_shapes: list[list[int]] = []  # [rows, response columns] of every micro-batch of the update
    minibatch_loss = module.minibatch_loss

    def recording_loss(rows, normalizer, forward):
        update_shapes.append(list(rows.loss_mask.shape))
        return minibatch_loss(rows, normalizer, forward)

    module.minibatch_loss = recording_loss
    data = PromptDataModule(
        tokenizer_name_or_path=model, batch_size=global_batch // devices, num_train_examples=32, shuffle=False
    )
    recorder = Recorder()
    strategy = FSDP2Strategy() if devices > 1 else "auto"
    checkpoints = []
    if max_steps > 0:  # written at the end of the last batch, as a periodic checkpoint would be
        checkpoints.append(ModelCheckpoint(out, filename="last", every_n_train_steps=max_steps))
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        max_epochs=1,
        max_steps=max_steps,
        limit_train_batches=batches,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=bool(checkpoints),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=out,
        callbacks=[
            recorder,
            EntropyDiscriminatorClipping("clip_b", mu=0.5),
            *checkpoints,
            *([InterruptRank1(sigint_rank1_batch)] if sigint_rank1_batch is not None else []),
        ],
    )
    interrupted = None
    try:
        trainer.fit(module, data, ckpt_path=ckpt_path)
    except RunInterrupted as stop:  # every rank wrote the interrupt checkpoint and stopped: no validation, no export
        interrupted = stop.code
    state = full_state_dict(module.policy)  # collective under FSDP2
    if trainer.global_rank == 0:
        os.makedirs(out, exist_ok=True)
        torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(out, "weights.pt"))
        info = {
            "rows": recorder.rows,
            "steps": recorder.steps,
            "global_step": trainer.global_step,
            "sharded": type(module.policy).__name__,
            "local_embedding_rows": _local_rows(module.policy.get_input_embeddings().weight),
            "ref_sharded": type(module.ref_model).__name__ if module.ref_model is not None else None,
            "ref_requires_grad": any(p.requires_grad for p in module.ref_model.parameters())
            if module.ref_model is not None
            else None,
            "export_path": module.export_path,
            "num_skipped_updates": module.skipped_updates.total,
            "update_shapes": update_shapes,
            "interrupted": interrupted,
        }
        Path(out, "metrics.json").write_text(json.dumps(info))
    if torch.distributed.is_initialized():
        # Both ranks leave together and tear gloo down while the interpreter is alive: a rank that exits while
        # the other still talks to it, or gloo threads destroyed at interpreter finalisation, abort the
        # process ("terminate called without an active exception").
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def _local_rows(weight: Tensor) -> int:
    """Rows of this rank's shard (all rows when not sharded)."""
    return int((weight.to_local() if hasattr(weight, "to_local") else weight).shape[0])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--export", action="store_true")
    parser.add_argument("--fsdp-param-dtype", default=None)
    parser.add_argument("--max-steps", type=int, default=-1)
    parser.add_argument("--ckpt-path", default=None)
    parser.add_argument("--sigint-rank1-batch", type=int, default=None)
    parser.add_argument("--algorithm", default="grpo")
    parser.add_argument("--max-tokens-per-micro-batch", type=int, default=None)
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--filter-groups", action="store_true")
    parser.add_argument("--lora", action="store_true")
    args = parser.parse_args()
    run(
        args.model,
        args.out,
        args.devices,
        args.global_batch,
        batches=args.batches,
        max_steps=args.max_steps,
        ckpt_path=args.ckpt_path,
        sigint_rank1_batch=args.sigint_rank1_batch,
        algorithm=args.algorithm,
        gradient_checkpointing=args.gradient_checkpointing,
        fsdp_param_dtype=args.fsdp_param_dtype,
        export_dir=os.path.join(args.out, "hf_model") if args.export else None,
        max_tokens_per_micro_batch=args.max_tokens_per_micro_batch,
        filter_groups=args.filter_groups,
        lora=args.lora,
    )


if __name__ == "__main__":
    main()

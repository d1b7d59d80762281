"""A short multi-turn GRPO fit for ``test_agents_distributed.py``: one process, 2 DDP ranks or 2 FSDP2 ranks.

Run as a script (Lightning's launcher re-executes it once per extra rank)::

    python tests/agents/_distributed_run.py --model DIR --out DIR --devices 2 --strategy fsdp2

Every rank writes ``rank<R>.json`` (logged ``train/*`` values per batch, the ``global_step``, the trajectories it
trained: prompt, turns, stop reason) and rank 0 ``weights.pt`` (the full policy, gathered from the shards).
Rollouts come from :class:`ContextSeededSampler`, whose turn for a context depends only on that context's ids, how
often the same context came before it in the call (the samples of one prompt) and the policy: never on the rank, the
batch's other rows or the global RNG, so two ranks sample what one process samples on the global batch.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from collections import Counter
from pathlib import Path

import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from torch import Tensor, nn

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.distributed.fsdp2 import FSDP2Strategy, full_state_dict
from lit_entropy.module import RFTModule
from lit_entropy.rollout import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig
from tests.agents._agents import CHAT_TEMPLATE

MAX_TURNS = 3
COMPARED = (
    "train/reward/mean",
    "train/reward/std",
    "train/length/mean",
    "train/loss/policy",
    "train/optim/grad_norm",
    "train/entropy/mean",
    "train/multi_turn/turns",
    "train/multi_turn/environment_token_frac",
    "train/multi_turn/environment_reward",
    "train/multi_turn/stop/length",
    "train/multi_turn/stop/max_turns",
    "train/multi_turn/stop/done",
)


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    """Varies across the samples of a random tiny model, so the groups have advantages."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class ContextSeededSampler(RolloutEngine):
    """Samples each row with a ``torch.Generator`` seeded by (its context ids, the occurrence of that context in the
    call); exactly ``max_new_tokens`` forward passes per call (FSDP2 ranks stay in step). The EOS logit is raised by
    ``eos_bias`` so that the random tiny model ends its turns after a few tokens (several turns per trajectory); the
    trainer scores the sampled ids under the policy itself (no rollout log-probs)."""

    reports_logprobs = False

    def __init__(self, eos_token_id: int, pad_token_id: int, eos_bias: float = 3.0) -> None:
        self.eos_token_id, self.pad_token_id, self.eos_bias = eos_token_id, pad_token_id, eos_bias

    @torch.no_grad()
    def generate(self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig):
        assert sampling.num_samples == 1  # multi-turn asks for one turn per live trajectory
        ids, mask = input_ids.clone(), attention_mask.clone()
        seen: Counter[tuple[int, ...]] = Counter()
        generators = []
        for row in range(ids.shape[0]):
            context = tuple(ids[row][mask[row].bool()].tolist())
            key = hashlib.sha256(repr((context, seen[context])).encode()).digest()
            seen[context] += 1
            generators.append(torch.Generator().manual_seed(int.from_bytes(key[:8], "little")))
        was_training = policy.training
        policy.eval()
        try:
            for _ in range(sampling.max_new_tokens):
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                logits = policy(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
                last = logits[:, -1].double()
                last[:, self.eos_token_id] += self.eos_bias
                probs = torch.softmax(last, -1)
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
        full_mask = torch.cat([attention_mask, response_mask.long()], 1)
        return RolloutBatch(sequences=ids, attention_mask=full_mask, response_mask=response_mask)


class Recorder(Callback):
    """Per batch: the compared ``train/*`` values and this rank's trajectories (prompt, turns, stop reason)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, float]] = []
        self.trajectories: list[list[list]] = []  # per batch: [prompt, turns, stop reason index] per row

    def setup(self, trainer, pl_module, stage) -> None:
        score = pl_module.score

        def recording(batch, rollout, num_samples):
            if pl_module.training:
                records = rollout.trajectories
                prompts = [p for p in batch["prompts"] for _ in range(num_samples)]
                self.trajectories.append(
                    [[p, int(t), int(s)] for p, t, s in zip(prompts, records.turns, records.stop_reasons, strict=True)]
                )
            return score(batch, rollout, num_samples)

        pl_module.score = recording

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.rows.append({k: float(metrics[k]) for k in COMPARED if k in metrics})


def run(model: str, out: str, devices: int, strategy: str, global_batch: int = 4, batches: int = 2) -> None:
    torch.set_num_threads(1)
    seed_everything(0)
    from transformers import AutoTokenizer  # noqa: PLC0415 - after the thread setting, as the launcher re-runs us

    tok = AutoTokenizer.from_pretrained(model)
    module = RFTModule(
        PolicyConfig(model),
        sampling=TrainingSamplingConfig(
            num_samples=4,
            max_new_tokens=48,
            multi_turn=MultiTurnConfig(
                environment="tests.agents._agents:Guess", max_turns=MAX_TURNS, chat_template=CHAT_TEMPLATE
            ),
        ),
        optim=OptimConfig(lr=1e-2),
        rollout=ContextSeededSampler(tok.eos_token_id, tok.pad_token_id),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.reward_fn = digit_reward
    data = PromptDataModule(
        tokenizer_name_or_path=model, batch_size=global_batch // devices, num_train_examples=16, shuffle=False,
        apply_chat_template=True,
    )  # fmt: skip
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu", devices=devices, strategy={"fsdp2": FSDP2Strategy(), "ddp": "ddp"}.get(strategy, "auto"),
        max_epochs=1, limit_train_batches=batches, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=out, callbacks=[recorder],
    )  # fmt: skip
    trainer.fit(module, data)
    state = full_state_dict(module.policy)  # collective under FSDP2
    os.makedirs(out, exist_ok=True)
    rank = trainer.global_rank
    local = {k: v.detach().cpu() for k, v in module.policy.state_dict().items()} if strategy == "ddp" else None
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in state.items()}, os.path.join(out, "weights.pt"))
    if local is not None:  # DDP: each rank's own replica, to compare
        torch.save(local, os.path.join(out, f"replica{rank}.pt"))
    info = {"rows": recorder.rows, "trajectories": recorder.trajectories, "global_step": trainer.global_step}
    Path(out, f"rank{rank}.json").write_text(json.dumps(info))
    if torch.distributed.is_initialized():
        # Both ranks leave together and tear gloo down while the interpreter is alive (PyTorch #190489).
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--strategy", choices=["ddp", "fsdp2", "single"], default="ddp")
    args = parser.parse_args()
    run(args.model, args.out, args.devices, args.strategy)


if __name__ == "__main__":
    main()

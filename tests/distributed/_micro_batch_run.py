"""Token-budget micro-batches on 2 gloo ranks under FSDP2, for ``test_micro_batches_ddp.py``.

Run as a script::

    python tests/distributed/_micro_batch_run.py --out DIR

Both ranks build the same float64 tiny Qwen2 and the same rollout batch (:func:`batch`); rank 0 takes its
long rows, rank 1 its short ones, so their own token-budget groupings differ in size (and rank 1 has fewer
rows than micro-batches). Each rank runs the update loop of one optimizer step (global normaliser, one
forward and backward per micro-batch) on the fully sharded model; rank 0 writes the gathered gradients per
loss aggregation mode and both ranks' own group counts to ``DIR/grads.pt``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: shared helpers

from _distributed import free_port, init_gloo  # noqa: E402
from _micro_batch_data import mixed_rollout, random_experience  # noqa: E402

from lit_entropy.data.char_tokenizer import build_char_tokenizer  # noqa: E402
from lit_entropy.models.tiny import build_qwen2  # noqa: E402
from lit_entropy.settings import LossConfig, RFTSettings, UpdateConfig  # noqa: E402
from lit_entropy.step import global_loss_normalizer, rows_update_loss  # noqa: E402
from lit_entropy.step.micro_batches import group_rows, micro_batches, row_lengths  # noqa: E402

PROMPTS = [3, 7, 5, 6, 2, 3, 2]
RESPONSES = [11, 9, 12, 10, 1, 2, 2]
RANK_ROWS = ([0, 1, 2, 3], [4, 5, 6])
BUDGET = 20
MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_qwen2(build_char_tokenizer(), num_layers=2, hidden_size=32).double()


def batch(model: torch.nn.Module):
    """The whole rollout batch and its experience (the same on every process)."""
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES)
    return random_experience(model, rollout)


def settings_for(mode: str) -> RFTSettings:
    return RFTSettings.build(loss=LossConfig(loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.05))


def worker(rank: int, world: int, port: int, out: str) -> None:
    from torch.distributed.fsdp import fully_shard

    from lit_entropy.distributed.fsdp2 import decoder_layers

    torch.set_num_threads(1)
    init_gloo(rank, world, port)
    model = build_model()
    experience = batch(model).rows(torch.tensor(RANK_ROWS[rank]))
    for layer in decoder_layers(model):
        fully_shard(layer)
    fully_shard(model)
    own = len(group_rows(*row_lengths(experience.rollout), BUDGET))
    counts = [torch.zeros(1, dtype=torch.long) for _ in range(world)]
    dist.all_gather(counts, torch.tensor([own]))
    result: dict[str, object] = {"own_groups": [int(c) for c in counts]}
    index = torch.arange(len(RANK_ROWS[rank]))
    for mode in MODES:
        model.zero_grad(set_to_none=True)
        settings = settings_for(mode)
        normalizer = global_loss_normalizer(experience.loss_mask, mode)
        plan = micro_batches(experience.rollout, UpdateConfig(max_tokens_per_micro_batch=BUDGET), index)
        for micro in plan:
            rows = experience.micro_batch(micro, trim=True)
            rows_update_loss(model, rows, settings, normalizer=normalizer).loss.backward()
        shape = torch.tensor([len(plan), sum(int(p.numel() == 0) for p in plan)])
        shapes = [torch.zeros_like(shape) for _ in range(world)]
        dist.all_gather(shapes, shape)
        result[f"{mode}/plans"] = [s.tolist() for s in shapes]  # per rank: micro-batches, empty ones
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        result[mode] = grads
    if rank == 0:
        torch.save(result, Path(out) / "grads.pt")
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    mp.spawn(worker, args=(2, free_port(), args.out), nprocs=2, join=True)


if __name__ == "__main__":
    main()

"""Collectives over the default process group that degrade to no-ops in a single process.

Mask-providing callbacks select tokens from *global* batch statistics and the module normalises its
loss by global counts; these helpers are how they see the other ranks. Every rank must call them in
the same order.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

__all__ = [
    "all_gather_counts",
    "all_gather_equal",
    "all_gather_values",
    "all_reduce_sum",
    "is_distributed",
    "world_size",
]


def is_distributed() -> bool:
    """True inside an initialised process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Number of ranks of the default process group (1 without one)."""
    return dist.get_world_size() if is_distributed() else 1


def all_reduce_sum(tensor: Tensor) -> Tensor:
    """Sum ``tensor`` over ranks in place (and return it)."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather_counts(count: int, device: torch.device) -> list[int]:
    """Every rank's ``count``, in rank order (``[count]`` when not distributed)."""
    if not is_distributed():
        return [int(count)]
    local = torch.tensor([count], dtype=torch.long, device=device)
    gathered = [torch.empty_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, local)
    return [int(t.item()) for t in gathered]


def all_gather_equal(tensor: Tensor) -> Tensor:
    """Concatenation, in rank order, of a tensor that has the same shape on every rank."""
    if not is_distributed():
        return tensor
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return torch.cat(gathered)


def all_gather_values(values: Tensor) -> Tensor:
    """Concatenation, in rank order, of every rank's 1-D ``values`` (lengths may differ)."""
    if not is_distributed():
        return values
    counts = all_gather_counts(values.numel(), values.device)
    padded = torch.full((max(counts),), math.nan, dtype=values.dtype, device=values.device)
    padded[: values.numel()] = values
    gathered = [torch.empty_like(padded) for _ in counts]
    dist.all_gather(gathered, padded)
    return torch.cat([g[:c] for g, c in zip(gathered, counts, strict=True)])

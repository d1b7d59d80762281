"""Collectives over the default process group that degrade to no-ops in a single process.

Mask-providing callbacks select tokens from *global* batch statistics and the module normalises its
loss by global counts; these helpers are how they see the other ranks. Every rank must call them in
the same order.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor
from torch.distributed.fsdp import FSDPModule

from lit_entropy.functional.selection import TopKCut, kth_largest, local_top_scores, tie_counts

__all__ = [
    "all_gather_counts",
    "all_gather_objects",
    "all_gather_equal",
    "all_reduce_max",
    "all_reduce_sum",
    "global_top_k_cut",
    "is_distributed",
    "unshard_root",
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


def all_gather_objects(obj: Any) -> list[Any]:
    """Every rank's picklable ``obj`` (tensors on the CPU), in rank order (``[obj]`` when not distributed)."""
    if not is_distributed():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def all_gather_equal(tensor: Tensor) -> Tensor:
    """Concatenation, in rank order, of a tensor that has the same shape on every rank."""
    if not is_distributed():
        return tensor
    gathered = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, tensor)
    return torch.cat(gathered)


def global_top_k_cut(scores: Tensor, candidates: Tensor, k: int) -> TopKCut:
    """This rank's :class:`~lit_entropy.functional.selection.top_k.TopKCut` of the global top-``k`` (two all-gathers).

    ``k`` must be the same on every rank. With it, ``top_k_mask(scores, candidates, cut)`` on each rank
    selects exactly what one process selects on the rank-major concatenation of the batches.
    """
    if k == 0:
        return TopKCut(0, math.inf, 0)
    # Each rank's own top-k (padded to k) holds every global top-k value it owns.
    threshold = float(kth_largest(all_gather_equal(local_top_scores(scores, candidates, k)), k))
    counts = all_gather_equal(tie_counts(scores, candidates, threshold)).reshape(-1, 2).tolist()
    rank = dist.get_rank() if is_distributed() else 0
    above = sum(c[0] for c in counts)
    return TopKCut(k, threshold, above, sum(c[1] for c in counts[:rank]))


def all_reduce_max(tensor: Tensor) -> Tensor:
    """Element-wise maximum of ``tensor`` over ranks in place (and return it); ``min`` is ``-max(-x)``."""
    if is_distributed():
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return tensor


def unshard_root(model: torch.nn.Module) -> None:
    """All-gather the parameters an FSDP2 ``model`` (``fully_shard``) holds itself, outside its sub-modules' groups
    (embeddings, final norm, LM head); a no-op for any other model. A collective under FSDP2.

    A forward whose graph is kept for later needs this before its backward when another backward ran in between:
    that backward ends by resharding them, and the blockwise vocabulary pass, which reads the LM head outside the
    model's forward, would find its storage freed (the model's own pre-backward hooks gather only after it)."""
    if isinstance(model, FSDPModule):
        model.unshard()

"""Exact top-k token selection with a deterministic tie-break that is identical under any sharding.

Every "keep / penalise / mask the k highest-scoring tokens" rule of :mod:`lit_entropy.functional`
(KL-Cov's top-k, Clip_V's cap, high-entropy selection) selects **exactly** ``k`` candidates (all of
them when fewer exist), ranked by ``(score descending, global token index ascending)``. The global
index is the row-major position in the global batch, with rank ``r``'s rows after those of ranks
``< r``. A threshold rule (``score >= k-th largest``) would instead select every token tied with the
``k``-th one: an all-zero-advantage batch has every covariance equal to 0 and would select them all.

A shard needs three global numbers, a :class:`TopKCut`: the ``k``-th largest candidate score, how
many candidates score strictly above it, and how many tied with it come earlier (on lower ranks).
It then takes its candidates above the threshold plus its first ``k - above - tied_before`` tied
ones in row-major order. The distributed recipe (callbacks do the collectives):

    top = all_gather(local_top_scores(scores, candidates, k))             # [world * k]
    threshold = kth_largest(top, k)
    counts = all_gather(tie_counts(scores, candidates, threshold))        # [world * 2]: (above, tied) per rank
    cut = TopKCut(k, threshold, sum of every rank's above, sum of the tied of ranks < this rank)
    selected = top_k_mask(scores, candidates, cut)

NaN scores are never selected and do not count toward ``k``; ``-inf`` is an ordinary (lowest) score.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["TopKCut", "kth_largest", "local_top_scores", "tie_counts", "top_k_cut", "top_k_mask"]


class TopKCut(NamedTuple):
    """Where a global top-``k`` cuts the ranking, as seen by one shard.

    Attributes:
        k: number of tokens the whole batch selects (>= 0).
        threshold: ``k``-th largest candidate score of the global batch; ``-inf`` with fewer than ``k``
            candidates, ``+inf`` when ``k == 0``.
        num_above: candidates of the global batch scoring strictly above ``threshold`` (< ``k``).
        tied_before: candidates scoring exactly ``threshold`` that precede this shard in global order.
    """

    k: int
    threshold: float
    num_above: int
    tied_before: int = 0


def _candidates(scores: Tensor, candidates: Tensor) -> Tensor:
    if candidates.shape != scores.shape:
        raise ValueError(f"candidates shape {tuple(candidates.shape)} does not match scores {tuple(scores.shape)}")
    candidates = candidates if candidates.dtype == torch.bool else candidates != 0
    return candidates & ~torch.isnan(scores)


def local_top_scores(scores: Tensor, candidates: Tensor, k: int) -> Tensor:
    """The ``k`` largest candidate scores of this shard, padded with ``-inf`` to length ``k``.

    A fixed length lets a distributed caller ``all_gather`` them; the global ``k``-th largest
    candidate score is then ``kth_largest(gathered, k)``.

    Returns:
        float64 ``[k]``, descending.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    picked = scores.detach().to(torch.float64)[_candidates(scores, candidates)]
    out = torch.full((k,), -math.inf, dtype=torch.float64, device=scores.device)
    take = min(k, picked.numel())
    if take:
        out[:take] = torch.topk(picked, take).values
    return out


def kth_largest(values: Tensor, k: int) -> Tensor:
    """``k``-th largest entry (1-based, counting duplicates) of ``values``; ``-inf`` when fewer than ``k``.

    Returns:
        float64 scalar tensor.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    flat = values.detach().reshape(-1).to(torch.float64)
    if flat.numel() < k:
        return torch.tensor(-math.inf, dtype=torch.float64, device=values.device)
    return torch.topk(flat, k).values[-1]


def tie_counts(scores: Tensor, candidates: Tensor, threshold: float | Tensor) -> Tensor:
    """This shard's ``(above, tied)``: candidates with ``score > threshold`` and ``score == threshold``.

    Returns:
        int64 ``[2]`` on the device of ``scores`` (ready for an ``all_gather``).
    """
    cand = _candidates(scores, candidates)
    values = scores.detach().to(torch.float64)
    threshold = torch.as_tensor(threshold, dtype=torch.float64, device=values.device)
    return torch.stack([(cand & (values > threshold)).sum(), (cand & (values == threshold)).sum()]).to(torch.long)


def top_k_cut(scores: Tensor, candidates: Tensor, k: int) -> TopKCut:
    """The :class:`TopKCut` of ``k`` when ``scores`` is the whole batch (a single process)."""
    if k < 0:
        raise ValueError(f"k must be >= 0, got {k}")
    if k == 0:
        return TopKCut(0, math.inf, 0)
    threshold = float(kth_largest(scores.detach().to(torch.float64)[_candidates(scores, candidates)], k))
    return TopKCut(k, threshold, int(tie_counts(scores, candidates, threshold)[0]))


def top_k_mask(scores: Tensor, candidates: Tensor, cut: TopKCut) -> Tensor:
    """This shard's part of the global top-``k``: exactly ``min(k, #candidates)`` tokens over all shards.

    Args:
        scores: ``[...]`` ranking scores (higher = selected first).
        candidates: bool, same shape: the tokens that may be selected.
        cut: the global cut (:func:`top_k_cut` for a single process; the module docstring for shards).

    Returns:
        bool mask of the selected tokens, shape of ``scores``, a subset of ``candidates``.
    """
    cand = _candidates(scores, candidates)
    if cut.k == 0:
        return torch.zeros_like(cand)
    values = scores.detach().to(torch.float64)
    threshold = torch.as_tensor(cut.threshold, dtype=torch.float64, device=values.device)
    above = cand & (values > threshold)
    tied = (cand & (values == threshold)).reshape(-1)
    # Tied tokens fill the remaining slots in global order: lower ranks first, then row-major here.
    remaining = cut.k - cut.num_above - cut.tied_before
    first = tied & (torch.cumsum(tied, 0) <= remaining)
    return above | first.reshape(cand.shape)

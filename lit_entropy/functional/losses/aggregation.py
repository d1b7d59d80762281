"""Loss aggregation: a per-token loss ``[B, T]`` reduced to the scalar one optimizer step minimises.

Aggregation modes use verl's names. Which one reproduces which recipe:
vanilla GRPO = ``seq-mean-token-mean``, DAPO = ``token-mean`` (the default), Dr.GRPO =
``seq-mean-token-sum-norm`` (with ``scale="none"`` advantages).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.masked import as_bool_mask, masked_mean, masked_sum

__all__ = ["LOSS_AGG_MODES", "aggregate_loss", "aggregation_options", "loss_normalizer_count"]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)


def loss_normalizer_count(mask: Tensor, loss_agg_mode: str, world_size: int = 1) -> Tensor:
    """This rank's share of :func:`aggregate_loss`'s global denominator.

    Valid tokens for ``token-mean``, sequences with at least one valid token for the ``seq-mean-*``
    modes, and ``1 / world_size`` for ``token-sum`` (a sum has no denominator). Summed over the
    data-parallel ranks and divided by ``world_size`` (their gradients are averaged), it is the
    ``normalizer`` that makes every shard's loss add up to the full-batch loss.

    Args:
        mask: ``[B, T]`` bool, this rank's rows of one optimizer step.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        world_size: number of data-parallel ranks.

    Returns:
        A float64 scalar tensor.
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    mask = as_bool_mask(mask)
    if loss_agg_mode == "token-sum":
        return torch.full((), 1.0 / world_size, dtype=torch.float64, device=mask.device)
    count = mask.sum() if loss_agg_mode == "token-mean" else mask.any(dim=-1).sum()
    return count.to(torch.float64)


def _check_positive(name: str, value: float | Tensor | None) -> None:
    if value is not None and isinstance(value, (int, float)):
        check_number(name, value, low=0.0, low_open=True)


def _check_shapes(per_token_loss: Tensor, mask: Tensor, token_weights: Tensor | None) -> None:
    if per_token_loss.shape != mask.shape or per_token_loss.dim() != 2:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} must share one [B, T] shape"
        )
    if token_weights is not None and token_weights.shape != mask.shape:
        raise ValueError(f"token_weights {tuple(token_weights.shape)} must have mask's shape {tuple(mask.shape)}")


def aggregate_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (verl's ``agg_loss`` semantics).

    - ``token-mean``: sum over valid tokens / number of valid tokens.
    - ``token-sum``: sum over valid tokens (divided by ``normalizer`` when given: pass the share
      ``1 / world_size`` under data parallel, whose gradient averaging would otherwise divide the sum).
    - ``seq-mean-token-mean``: per sequence, mean over its valid tokens; then mean over sequences.
    - ``seq-mean-token-sum``: per sequence, sum over its valid tokens; then mean over sequences.
    - ``seq-mean-token-sum-norm``: per sequence, token sum / ``loss_scale_factor`` (default
      ``T = mask.shape[-1]``, a constant as in Dr.GRPO); then mean over sequences.

    Sequences without any valid token contribute nothing and are not counted.

    Args:
        per_token_loss: ``[B, T]``.
        mask: ``[B, T]`` bool, True = the token is in the loss.
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        normalizer: when given (> 0), the denominator replacing the local count: the number of
            valid tokens (``token-mean``) or of sequences (``seq-mean-*``) of the *global* batch.
            Then ``sum(shard losses)`` over mini-batches or ranks equals the full-batch loss
            exactly, e.g. gradient accumulation over micro-batches with the global token count.
        loss_scale_factor: the constant of ``seq-mean-token-sum-norm`` (> 0); ignored otherwise.
        token_weights: ``[B, T]`` detached weights multiplying each token's loss before the reduction (rollout
            correction, :mod:`lit_entropy.functional.rollout_correction`); the counts are unchanged.

    Returns:
        Scalar tensor (0 when nothing is valid).
    """
    check_choice("loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    _check_shapes(per_token_loss, mask, token_weights)
    _check_positive("normalizer", normalizer)
    _check_positive("loss_scale_factor", loss_scale_factor)
    mask = as_bool_mask(mask)
    dtype = per_token_loss.dtype
    if token_weights is not None:
        per_token_loss = per_token_loss * torch.where(mask, token_weights.detach().to(dtype), 0.0)
    if loss_agg_mode in ("token-mean", "token-sum"):
        total = masked_sum(per_token_loss, mask)
        count = mask.sum() if loss_agg_mode == "token-mean" else torch.ones((), device=mask.device)
    else:
        if loss_agg_mode == "seq-mean-token-mean":
            per_seq = masked_mean(per_token_loss, mask, dim=-1)
        else:
            per_seq = masked_sum(per_token_loss, mask, dim=-1)
            if loss_agg_mode == "seq-mean-token-sum-norm":
                per_seq = per_seq / (loss_scale_factor if loss_scale_factor is not None else mask.shape[-1])
        seq_valid = mask.any(dim=-1)
        total = masked_sum(per_seq, seq_valid)
        count = seq_valid.sum()
    if normalizer is None:
        return total / count.clamp(min=1).to(dtype)
    return total / torch.as_tensor(normalizer, dtype=dtype, device=total.device)


def aggregation_options(
    normalizer: float | Tensor | None, loss_scale_factor: float | None, token_weights: Tensor | None
) -> dict[str, Any]:
    """:func:`aggregate_loss`'s keyword options (``token_weights``: rollout correction of each token's loss term)."""
    return {"normalizer": normalizer, "loss_scale_factor": loss_scale_factor, "token_weights": token_weights}

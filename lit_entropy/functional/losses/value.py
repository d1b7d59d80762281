"""The PPO clipped value loss of the critic."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_number
from lit_entropy.functional.losses.aggregation import aggregate_loss
from lit_entropy.functional.masked import as_bool_mask, compute_dtype, masked_mean

__all__ = ["check_value_loss_args", "value_loss"]


def check_value_loss_args(*, clip_range_value: float | None, prefix: str = "") -> None:
    """Validate :func:`value_loss`'s clip range: a finite number > 0, or None (no clipping)."""
    check_number(f"{prefix}clip_range_value", clip_range_value, low=0.0, low_open=True, optional=True)


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range_value: float | None = 0.2,
    loss_agg_mode: str = "token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)``, aggregated.

    Args:
        values: current critic values ``[B, T]`` (differentiable).
        old_values: critic values at rollout time ``[B, T]`` (detached inside).
        returns: targets ``[B, T]`` (detached inside).
        mask: ``[B, T]`` bool.
        clip_range_value: ``c > 0``; None disables clipping (plain 0.5 squared error).
        loss_agg_mode: see :func:`aggregate_loss`.
        normalizer: global denominator, see :func:`aggregate_loss`.
        loss_scale_factor: constant of ``seq-mean-token-sum-norm``.

    Returns:
        ``(loss, clip_frac)``: scalar loss and the detached fraction of valid tokens where the
        clipped term is strictly larger (the clip binds).
    """
    check_value_loss_args(clip_range_value=clip_range_value)
    if not (values.shape == old_values.shape == returns.shape == mask.shape) or values.dim() != 2:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns {tuple(returns.shape)} "
            f"and mask {tuple(mask.shape)} must share one [B, T] shape"
        )
    mask = as_bool_mask(mask)
    dtype = compute_dtype(values, old_values, returns)
    zero = torch.zeros((), dtype=dtype, device=values.device)
    v = torch.where(mask, values.to(dtype), zero)
    v_old = torch.where(mask, old_values.detach().to(dtype), zero)
    target = torch.where(mask, returns.detach().to(dtype), zero)
    loss_plain = (v - target).square()
    if clip_range_value is None:
        per_token = loss_plain
        frac = torch.zeros((), dtype=dtype, device=values.device)
    else:
        v_clipped = torch.minimum(torch.maximum(v, v_old - clip_range_value), v_old + clip_range_value)
        loss_clipped = (v_clipped - target).square()
        per_token = torch.maximum(loss_plain, loss_clipped)
        frac = masked_mean((loss_clipped > loss_plain).to(dtype), mask).detach()
    loss = 0.5 * aggregate_loss(
        per_token, mask, loss_agg_mode, normalizer=normalizer, loss_scale_factor=loss_scale_factor
    )
    return loss, frac

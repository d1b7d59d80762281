"""CISPO (MiniMax-M1, 2025): clipped importance-sampling weights on a REINFORCE loss, every token keeps a gradient.

Registered as ``cispo`` in :data:`~lit_entropy.functional.registry.POLICY_LOSSES`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.masked import as_bool_mask, compute_dtype, masked_mean
from lit_entropy.functional.policy_loss import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    _token_advantages,
    aggregate_loss,
    check_policy_loss_args,
)
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["cispo_policy_loss"]


@register_policy_loss("cispo")
def cispo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """CISPO: per token ``-sg(clip(r, 1 - eps_low, 1 + eps_high)) * A * log pi``, aggregated over ``mask``.

    Unlike PPO's clip, which zeroes the gradient of a token whose ratio left the range, CISPO caps the
    token's (detached) importance weight and keeps its gradient ``clip(r) A grad log pi``; inside the
    range the gradient equals the unclipped surrogate's ``r A grad log pi``. The paper normalises by the
    total token count (``token-mean``) and effectively clips only from above (a large ``eps_low``).
    The loss *value* is a REINFORCE surrogate (it contains ``log pi``), not PPO's ratio objective.

    Args:
        logprobs, old_logprobs: ``[B, T]`` current (differentiable) and behaviour log-probs.
        advantages: ``[B, T]`` or ``[B]`` (detached).
        mask: ``[B, T]`` bool loss mask.
        clip_ratio_low, clip_ratio_high: the weight's range ``[1 - eps_low, 1 + eps_high]``.
        clip_ratio_c: not read (the weight is already capped; no dual clip).
        loss_agg_mode, normalizer, loss_scale_factor: see :func:`~lit_entropy.functional.aggregate_loss`.
        extra: not read.

    Returns:
        ``(loss, stats)``; ``clip_frac_low`` / ``clip_frac_high`` are the loss tokens whose weight is cut
        (``r < 1 - eps_low`` / ``r > 1 + eps_high``, whatever the advantage's sign: the weight is capped,
        the gradient kept).
    """
    check_policy_loss_args(
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=None,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )
    advantages = _token_advantages(logprobs, old_logprobs, advantages, mask)
    mask = as_bool_mask(mask)
    dtype = compute_dtype(logprobs, old_logprobs, advantages)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lp = torch.where(mask, logprobs.to(dtype), zero)
    adv = torch.where(mask, advantages.detach().to(dtype).expand(mask.shape), zero)
    log_ratio = torch.where(mask, lp.detach() - old_logprobs.detach().to(dtype), zero)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = -weight * adv * lp
    loss = aggregate_loss(per_token, mask, loss_agg_mode, normalizer=normalizer, loss_scale_factor=loss_scale_factor)
    return loss, _cispo_stats(ratio, log_ratio, mask, clip_ratio_low, clip_ratio_high)


@torch.no_grad()
def _cispo_stats(
    ratio: Tensor, log_ratio: Tensor, mask: Tensor, clip_ratio_low: float, clip_ratio_high: float
) -> PolicyLossStats:
    """Fractions of loss tokens whose weight is cut (either sign of ``A``), ``k3`` KL and mean ratio."""
    dtype = ratio.dtype
    low = ratio < 1.0 - clip_ratio_low
    high = ratio > 1.0 + clip_ratio_high
    return PolicyLossStats(
        clip_frac_low=masked_mean(low.to(dtype), mask),
        clip_frac_high=masked_mean(high.to(dtype), mask),
        clip_frac=masked_mean((low | high).to(dtype), mask),
        dual_clip_frac=torch.zeros((), dtype=dtype, device=ratio.device),
        approx_kl=masked_mean(ratio - 1.0 - log_ratio, mask),
        ratio_mean=masked_mean(ratio, mask),
    )

"""CISPO (MiniMax-M1, 2025): clipped importance-sampling weights on a REINFORCE loss, every token keeps a gradient.

Registered as ``cispo`` in :data:`~lit_entropy.functional.registry.POLICY_LOSSES`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.losses.aggregation import aggregate_loss, aggregation_options
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_clip_ratios,
    clip_indicator_stats,
    prepare_ratio_inputs,
)
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["cispo_policy_loss"]


@register_policy_loss("cispo", first_order_entropy=True)
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
    token_weights: Tensor | None = None,
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
        token_weights: ``[B, T]`` rollout-correction weights multiplying each token's loss term; None = 1.
        extra: not read.

    Returns:
        ``(loss, stats)``; ``clip_frac_low`` / ``clip_frac_high`` are the loss tokens whose weight is cut
        (``r < 1 - eps_low`` / ``r > 1 + eps_high``, whatever the advantage's sign: the weight is capped,
        the gradient kept).
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high, loss_agg_mode, loss_scale_factor)
    mask, _, lp, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, None)
    log_ratio = log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    weight = ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = -weight * adv * lp
    agg = aggregation_options(normalizer, loss_scale_factor, token_weights)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    # the weight is capped whatever the advantage's sign, so both cuts count
    low, high = ratio < 1.0 - clip_ratio_low, ratio > 1.0 + clip_ratio_high
    return loss, clip_indicator_stats(low, high, ratio, log_ratio, mask)

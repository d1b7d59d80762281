"""SAPO (Qwen, arXiv 2511.20347): a smooth, temperature-gated surrogate instead of PPO's hard clip.

Registered as ``sapo``; its verl 0.9.1 counterpart is ``compute_policy_loss_sapo``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_number
from lit_entropy.functional.losses.aggregation import aggregate_loss, aggregation_options
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_clip_ratios,
    clip_indicator_stats,
    prepare_ratio_inputs,
)
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["sapo_policy_loss"]


@register_policy_loss("sapo", first_order_entropy=True, loss_agg_mode="seq-mean-token-mean")
def sapo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """SAPO: per token ``-f(r) A`` with the gate ``f(r) = (4 / tau) sigmoid(tau (r - 1))``.

    ``tau = tau_pos`` where ``A > 0``, else ``tau_neg`` (the paper's 1.0 and 1.05: negative updates fade
    faster). ``f'(1) = 1``, so at an on-policy update every token's gradient is ``A grad log pi``; away from
    ``r = 1`` the gradient ``f'(r) r A`` decays smoothly instead of dropping to zero at a clip edge.

    Args:
        logprobs, old_logprobs: ``[B, T]`` current (differentiable) and behaviour log-probs.
        advantages: ``[B, T]`` or ``[B]``.
        mask: ``[B, T]`` bool loss mask.
        clip_ratio_low, clip_ratio_high, clip_ratio_c: not read (no clip).
        loss_agg_mode, normalizer, loss_scale_factor: see :func:`~lit_entropy.functional.aggregate_loss` (the
            paper's, and verl's fixed choice, is ``seq-mean-token-mean``).
        token_weights: ``[B, T]`` rollout-correction weights of each token's loss term; None = 1.
        tau_pos, tau_neg: the gate temperatures (> 0), set with ``model.loss.policy_loss_options``.
        extra: not read.

    Returns:
        ``(loss, stats)``; no clip fraction (0).
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high, loss_agg_mode, loss_scale_factor)
    check_number("tau_pos", tau_pos, low=0, low_open=True)
    check_number("tau_neg", tau_neg, low=0, low_open=True)
    mask, _, _, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, None)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    tau = torch.where(adv > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    per_token = -gate * adv
    loss = aggregate_loss(
        per_token, mask, loss_agg_mode, **aggregation_options(normalizer, loss_scale_factor, token_weights)
    )
    none = torch.zeros_like(mask)
    return loss, clip_indicator_stats(none, none, ratio, log_ratio, mask)

"""CE-GPPO (Kuaishou Klear, arXiv 2509.20712): PPO's clip with a bounded gradient kept on the clipped tokens.

Registered as ``ce_gppo``. Source: the authors' code, GitHub Kwai-Klear/CE-GPPO,
``verl/trainer/ppo/core_algos.py`` (``compute_gppo_loss_general_beta``); defaults ``beta1 = 0.75``,
``beta2 = 1.0`` from its README.
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
    check_policy_loss_args,
    clip_indicator_stats,
    prepare_ratio_inputs,
)
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["ce_gppo_policy_loss"]


@register_policy_loss("ce_gppo", first_order_entropy=True, dual_clip=True)
def ce_gppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    token_weights: Tensor | None = None,
    beta1: float = 0.75,
    beta2: float = 1.0,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """CE-GPPO: PPO's surrogate, except that a clipped token keeps a scaled gradient.

    Per token, with ``r`` the ratio and ``sg`` stop-gradient: ``-beta1 (1 - eps_low) (r / sg(r)) A`` where
    ``r < 1 - eps_low`` and ``A < 0``; ``-beta2 (1 + eps_high) (r / sg(r)) A`` where ``r > 1 + eps_high`` and
    ``A > 0``; ``-r A`` elsewhere; then the dual clip ``min(., -c A)`` on ``A < 0`` when ``clip_ratio_c`` is set.
    The clipped tokens' value is PPO's clipped value times ``beta``, their gradient
    ``beta (1 -/+ eps) A grad log pi``: the low-probability tokens PPO silences keep a bounded say, which is what
    steers the entropy (``beta1`` small: fewer entropy-raising negative updates, ``beta2`` large: more
    entropy-lowering positive ones).

    Args:
        logprobs, old_logprobs: ``[B, T]`` current (differentiable) and behaviour log-probs.
        advantages: ``[B, T]`` or ``[B]``.
        mask: ``[B, T]`` bool loss mask.
        clip_ratio_low, clip_ratio_high: PPO's ``eps_low``, ``eps_high``.
        clip_ratio_c: the dual-clip constant (> 1) or None.
        loss_agg_mode, normalizer, loss_scale_factor: see :func:`~lit_entropy.functional.aggregate_loss`.
        token_weights: ``[B, T]`` rollout-correction weights; None = 1.
        beta1, beta2: the clipped tokens' gradient scales (>= 0), set with ``model.loss.policy_loss_options``.
        extra: not read.
    """
    check_policy_loss_args(
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor,
    )  # fmt: skip
    check_number("beta1", beta1, low=0)
    check_number("beta2", beta2, low=0)
    mask, _, _, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, None)
    ratio = torch.exp(log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    per_token, low, high, dual = _ce_gppo_terms(ratio, adv, clip_ratio_low, clip_ratio_high, clip_ratio_c, beta1, beta2)
    loss = aggregate_loss(
        per_token, mask, loss_agg_mode, **aggregation_options(normalizer, loss_scale_factor, token_weights)
    )
    return loss, clip_indicator_stats(low, high, ratio, log_ratio, mask, dual.detach())


def _ce_gppo_terms(
    ratio: Tensor, adv: Tensor, eps_low: float, eps_high: float, clip_ratio_c: float | None, beta1: float, beta2: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per-token loss and the low-clip, high-clip and dual-clip indicators (all ``[B, T]``)."""
    r_sg = ratio.detach()
    low = (r_sg < 1 - eps_low) & (adv < 0)
    high = (r_sg > 1 + eps_high) & (adv > 0)
    kept = ratio / r_sg  # value 1, gradient grad log pi
    per_token = torch.where(low, -beta1 * (1 - eps_low) * kept * adv, -ratio * adv)
    per_token = torch.where(high, -beta2 * (1 + eps_high) * kept * adv, per_token)
    dual = torch.zeros_like(low)
    if clip_ratio_c is not None:
        dual = (adv < 0) & (per_token > -adv * clip_ratio_c)
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * clip_ratio_c), per_token)
    return per_token, low, high, dual

"""DPPO-Binary (arXiv 2602.04879): a trust region on the sampled token's probability instead of its ratio.

Registered as ``dppo_tv`` (total variation of the binary distribution ``(p, 1 - p)``: ``|p - p_old|``) and
``dppo_kl`` (its KL); verl 0.9.1's ``compute_policy_loss_dppo_tv`` / ``compute_policy_loss_dppo_kl``. As in verl,
``model.loss.clip_ratio_low`` / ``clip_ratio_high`` are the divergence thresholds for ``A < 0`` / ``A > 0`` (not
ratio ranges), and ``clip_ratio_c`` truncates the detached importance weight (truncated IS; null: none).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.losses.aggregation import aggregate_loss, aggregation_options
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_policy_loss_args,
    clip_indicator_stats,
    prepare_ratio_inputs,
)
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["binary_kl", "dppo_kl_policy_loss", "dppo_tv_policy_loss"]

BINARY_KL_EPS = 1e-8  # verl's, inside the log of the complement probabilities


def binary_kl(old_logprobs: Tensor, logprobs: Tensor) -> Tensor:
    """``KL((p_old, 1 - p_old) || (p, 1 - p))`` per token (verl's form, ``1e-8`` in the complement's log)."""
    p, p_old = logprobs.exp(), old_logprobs.exp()
    return p_old * (old_logprobs - logprobs) + (1 - p_old) * torch.log(
        (1.0 - p_old + BINARY_KL_EPS) / (1.0 - p + BINARY_KL_EPS)
    )


def _dppo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    divergence: str,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    loss_agg_mode: str,
    normalizer: float | Tensor | None,
    loss_scale_factor: float | None,
    token_weights: Tensor | None,
) -> tuple[Tensor, PolicyLossStats]:
    check_policy_loss_args(
        clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high, clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode, loss_scale_factor=loss_scale_factor,
    )  # fmt: skip
    mask, _, lp, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, None)
    old = torch.where(mask, old_logprobs.detach().to(lp.dtype), 0.0)
    ratio = torch.exp(log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))
    weight = ratio if clip_ratio_c is None else ratio.clamp(max=clip_ratio_c)
    with torch.no_grad():
        p, p_old = lp.detach().exp(), old.exp()
        if divergence == "tv":
            up_ok, down_ok = (p - p_old) <= clip_ratio_high, (p - p_old) >= -clip_ratio_low
        else:
            kl = binary_kl(old, lp.detach())
            up_ok, down_ok = (kl <= clip_ratio_high) | (p <= p_old), (kl <= clip_ratio_low) | (p >= p_old)
        valid = torch.where(adv > 0, up_ok, down_ok)
    per_token = -adv * weight * lp * valid
    loss = aggregate_loss(
        per_token, mask, loss_agg_mode, **aggregation_options(normalizer, loss_scale_factor, token_weights)
    )
    truncated = (ratio > clip_ratio_c) & valid if clip_ratio_c is not None else torch.zeros_like(mask)
    return loss, clip_indicator_stats(~valid & (adv <= 0), ~valid & (adv > 0), ratio, log_ratio, mask, truncated)


@register_policy_loss("dppo_tv", first_order_entropy=True, dual_clip=True)
def dppo_tv_policy_loss(
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
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """DPPO-Binary-TV: per token ``-A sg(min(r, c)) log pi``, kept while ``p - p_old <= delta_high`` (A > 0) or
    ``p - p_old >= -delta_low`` (A <= 0), ``delta`` the ``clip_ratio_*`` settings.

    Returns:
        ``(loss, stats)``: ``clip_frac_high`` / ``clip_frac_low`` the loss tokens outside the trust region with
        A > 0 / A <= 0; ``dual_clip_frac`` those inside it whose weight ``c`` truncated.
    """
    return _dppo_loss(
        logprobs, old_logprobs, advantages, mask, "tv", clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c, loss_agg_mode=loss_agg_mode, normalizer=normalizer,
        loss_scale_factor=loss_scale_factor, token_weights=token_weights,
    )  # fmt: skip


@register_policy_loss("dppo_kl", first_order_entropy=True, dual_clip=True)
def dppo_kl_policy_loss(
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
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """DPPO-Binary-KL: as ``dppo_tv`` with the binary KL as divergence; a token is kept while its KL is within
    ``clip_ratio_high`` (A > 0; ``clip_ratio_low`` for A <= 0) or it moved in the direction that lowers the loss
    no further (``p <= p_old`` for A > 0, ``p >= p_old`` for A <= 0)."""
    return _dppo_loss(
        logprobs, old_logprobs, advantages, mask, "kl", clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c, loss_agg_mode=loss_agg_mode, normalizer=normalizer,
        loss_scale_factor=loss_scale_factor, token_weights=token_weights,
    )  # fmt: skip

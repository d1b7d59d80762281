"""The PPO clipped surrogate (asymmetric clip-higher, dual clip), registered as the ``ppo`` policy loss."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.losses.aggregation import aggregate_loss, aggregation_options
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_policy_loss_args,
    clipped_token_masks,
    token_advantages,
)
from lit_entropy.functional.masked import as_bool_mask, compute_dtype, masked_mean
from lit_entropy.functional.registry import register_policy_loss

__all__ = ["policy_loss", "ppo_policy_loss"]


def policy_loss(
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
) -> tuple[Tensor, PolicyLossStats]:
    """PPO clipped surrogate with asymmetric (clip-higher) ratio bounds and optional dual clip.

    Per token, with ``r = exp(clamp(logp - old, -20, 20))``:
    ``loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; with ``clip_ratio_c = c`` and
    ``A < 0`` it is ``min(loss, -A c)`` (verl's ``clip_ratio_c``). Then aggregated by
    :func:`aggregate_loss`. Invalid positions are zeroed before any arithmetic, so garbage
    (inf/NaN) there reaches neither the loss nor the gradient.

    Args:
        logprobs: current policy log-probs of the sampled tokens ``[B, T]`` (differentiable).
        old_logprobs: behaviour-policy log-probs ``[B, T]`` (detached inside).
        advantages: ``[B, T]`` or per-sequence ``[B]`` (broadcast over tokens; detached inside).
        mask: ``[B, T]`` bool.
        clip_ratio_low: ``eps_low >= 0``.
        clip_ratio_high: ``eps_high >= 0`` (DAPO clip-higher uses 0.28).
        clip_ratio_c: dual-clip constant ``> 1`` or None (off).
        loss_agg_mode, normalizer, loss_scale_factor: see :func:`aggregate_loss`.
        token_weights: ``[B, T]`` rollout-correction weights of each token's loss term (see :func:`aggregate_loss`).

    Returns:
        ``(loss, stats)``: scalar loss (float32 or float64) and :class:`PolicyLossStats`.
    """
    check_policy_loss_args(
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )
    advantages = token_advantages(logprobs, old_logprobs, advantages, mask)
    mask = as_bool_mask(mask)
    dtype = compute_dtype(logprobs, old_logprobs, advantages)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    adv = torch.where(mask, advantages.detach().to(dtype), zero)
    log_ratio = torch.where(mask, logprobs.to(dtype) - old_logprobs.detach().to(dtype), zero)
    log_ratio = log_ratio.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    if clip_ratio_c is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * clip_ratio_c), per_token)
    agg = aggregation_options(normalizer, loss_scale_factor, token_weights)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    return loss, _policy_loss_stats(log_ratio, ratio, adv, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c)


@torch.no_grad()
def _policy_loss_stats(
    log_ratio: Tensor,
    ratio: Tensor,
    adv: Tensor,
    mask: Tensor,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
) -> PolicyLossStats:
    """Clip fractions, approximate KL and mean ratio over the valid tokens (all ``[B, T]``, ``mask`` bool)."""
    dtype = ratio.dtype
    r = ratio.detach()
    low, high = clipped_token_masks(r, adv, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    dual = (adv < 0) & (r > clip_ratio_c) if clip_ratio_c is not None else torch.zeros_like(mask)
    return PolicyLossStats(
        clip_frac_low=masked_mean(low.to(dtype), mask),
        clip_frac_high=masked_mean(high.to(dtype), mask),
        clip_frac=masked_mean((low | high).to(dtype), mask),
        dual_clip_frac=masked_mean(dual.to(dtype), mask),
        approx_kl=masked_mean(r - 1.0 - log_ratio.detach(), mask),
        ratio_mean=masked_mean(r, mask),
    )


@register_policy_loss("ppo", first_order_entropy=True, dual_clip=True)
def ppo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    loss_agg_mode: str,
    normalizer: float | Tensor | None,
    loss_scale_factor: float | None,
    token_weights: Tensor | None = None,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """The registered ``ppo`` policy loss: :func:`policy_loss` with the registry's signature.

    ``extra`` (``response_mask``, ...) is not read: the clipped surrogate is per token over ``mask``.
    """
    return policy_loss(
        logprobs,
        old_logprobs,
        advantages,
        mask,
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=clip_ratio_c,
        loss_agg_mode=loss_agg_mode,
        normalizer=normalizer,
        loss_scale_factor=loss_scale_factor,
        token_weights=token_weights,
    )

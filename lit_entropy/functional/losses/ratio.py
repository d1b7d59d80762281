"""The importance ratio every policy loss is built on, and what the losses share around it.

``r = exp(clamp(log pi - log pi_old, -20, 20))`` per token: its clamp (:data:`LOG_RATIO_CLAMP`), the tokens the
PPO clip removes (:func:`clipped_token_masks`), the argument check of the clip range and aggregation
(:func:`check_policy_loss_args`), the inputs a loss prepares from ``(logprobs, old_logprobs, advantages, mask)``
(:func:`token_advantages`, :func:`prepare_ratio_inputs`) and the diagnostics every registered loss returns
(:class:`PolicyLossStats`, :func:`clip_indicator_stats`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.losses.aggregation import LOSS_AGG_MODES
from lit_entropy.functional.masked import as_bool_mask, compute_dtype, masked_mean

__all__ = [
    "LOG_RATIO_CLAMP",
    "PolicyLossStats",
    "check_clip_ratios",
    "check_policy_loss_args",
    "clip_indicator_stats",
    "clipped_token_masks",
    "prepare_ratio_inputs",
    "token_advantages",
]

# The log-ratio is clamped before exp() (as verl does) so that a stale or garbage log-prob cannot
# overflow the ratio; outside [-20, 20] the ratio is constant and carries no gradient.
LOG_RATIO_CLAMP = 20.0


def clipped_token_masks(
    ratio: Tensor, advantages: Tensor, *, clip_ratio_low: float = 0.2, clip_ratio_high: float = 0.2
) -> tuple[Tensor, Tensor]:
    """Tokens whose gradient the PPO ratio clip removes, counted as TRL does.

    Args:
        ratio: importance ratio ``pi / pi_old`` per token, ``[B, T]``.
        advantages: advantages broadcastable to ``ratio``.
        clip_ratio_low: lower clip epsilon (ratio floor ``1 - clip_ratio_low``).
        clip_ratio_high: upper clip epsilon (ratio ceiling ``1 + clip_ratio_high``).

    Returns:
        ``(low, high)`` boolean tensors of ``ratio``'s shape: low-clipped is
        ``ratio < 1 - eps_low`` with ``A < 0``; high-clipped is ``ratio > 1 + eps_high`` with ``A > 0``.
    """
    low = (ratio < 1.0 - clip_ratio_low) & (advantages < 0)
    high = (ratio > 1.0 + clip_ratio_high) & (advantages > 0)
    return low, high


def check_policy_loss_args(
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
    prefix: str = "",
) -> None:
    """Validate the arguments of :func:`~lit_entropy.functional.losses.ppo.policy_loss`; ``prefix`` turns names into
    setting names (``model.loss.``).

    Raises:
        ValueError: ``clip_ratio_low`` outside ``[0, 1)``, ``clip_ratio_high`` not ``>= 0``, ``clip_ratio_c``
            not ``> 1`` (or None), an unknown ``loss_agg_mode``, a non-positive ``loss_scale_factor``.
    """
    check_number(f"{prefix}clip_ratio_low", clip_ratio_low, low=0.0, high=1.0, high_open=True)
    check_number(f"{prefix}clip_ratio_high", clip_ratio_high, low=0.0)
    check_number(f"{prefix}clip_ratio_c", clip_ratio_c, low=1.0, low_open=True, optional=True)
    check_choice(f"{prefix}loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    check_number(f"{prefix}loss_scale_factor", loss_scale_factor, low=0.0, low_open=True, optional=True)


def check_clip_ratios(
    clip_ratio_low: float, clip_ratio_high: float, loss_agg_mode: str, loss_scale_factor: float | None
) -> None:
    """:func:`check_policy_loss_args` for a loss without PPO's dual clip (``clip_ratio_c`` not read)."""
    check_policy_loss_args(
        clip_ratio_low=clip_ratio_low,
        clip_ratio_high=clip_ratio_high,
        clip_ratio_c=None,
        loss_agg_mode=loss_agg_mode,
        loss_scale_factor=loss_scale_factor,
    )


class PolicyLossStats(NamedTuple):
    """Detached scalar diagnostics of one policy-loss call; fractions are over valid tokens.

    Attributes:
        clip_frac_low: ``ratio < 1 - eps_low`` with ``A < 0`` (lower clip binds).
        clip_frac_high: ``ratio > 1 + eps_high`` with ``A > 0`` (upper clip binds).
        clip_frac: either of the two.
        dual_clip_frac: ``A < 0`` and ``ratio > clip_ratio_c`` (the dual clip binds; 0 when off).
        approx_kl: masked mean of ``k3`` for KL(old || new): ``ratio - 1 - log(ratio)`` (>= 0).
        ratio_mean: masked mean of the importance ratio.
    """

    clip_frac_low: Tensor
    clip_frac_high: Tensor
    clip_frac: Tensor
    dual_clip_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor


def token_advantages(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Check the shapes of a policy loss's inputs; per-sequence advantages ``[B]`` become ``[B, 1]``."""
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must share one [B, T] shape"
        )
    if advantages.shape == logprobs.shape[:1]:
        return advantages.unsqueeze(-1)
    if advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} must be {tuple(logprobs.shape)} or {tuple(logprobs.shape[:1])}"
        )
    return advantages


def prepare_ratio_inputs(
    logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor, response_mask: Tensor | None
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Shared inputs: ``(mask, response, logprobs, log_ratio, token_advantages)``, zero outside ``response``.

    ``logprobs`` is cast to the compute dtype and stays differentiable; ``old_logprobs`` and
    ``advantages`` (``[N]`` or ``[N, T]``) are detached; the advantages are expanded to ``[N, T]``.
    """
    advantages = token_advantages(logprobs, old_logprobs, advantages, mask)
    mask = as_bool_mask(mask)
    if response_mask is None:
        response = mask
    else:
        if response_mask.shape != mask.shape:
            raise ValueError(f"response_mask {tuple(response_mask.shape)} must have mask's shape {tuple(mask.shape)}")
        response = as_bool_mask(response_mask) | mask
    dtype = compute_dtype(logprobs, old_logprobs, advantages)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    lp = torch.where(response, logprobs.to(dtype), zero)
    log_ratio = torch.where(response, lp - old_logprobs.detach().to(dtype), zero)
    adv = torch.where(response, advantages.detach().to(dtype).expand(mask.shape), zero)
    return mask, response, lp, log_ratio, adv


@torch.no_grad()
def clip_indicator_stats(
    low: Tensor, high: Tensor, ratio: Tensor, token_log_ratio: Tensor, mask: Tensor, dual: Tensor | None = None
) -> PolicyLossStats:
    """Token-weighted fractions over ``mask`` of the ``[N, T]`` clip indicators (``dual``: the dual-clip or
    truncation indicator, None for a loss without one), mean ``ratio`` and ``k3`` KL."""
    dtype = ratio.dtype
    log_r = token_log_ratio.detach().clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return PolicyLossStats(
        clip_frac_low=masked_mean(low.to(dtype), mask),
        clip_frac_high=masked_mean(high.to(dtype), mask),
        clip_frac=masked_mean((low | high).to(dtype), mask),
        dual_clip_frac=(
            torch.zeros((), dtype=dtype, device=ratio.device) if dual is None else masked_mean(dual.to(dtype), mask)
        ),
        approx_kl=masked_mean(torch.exp(log_r) - 1.0 - log_r, mask),
        ratio_mean=masked_mean(ratio.detach().expand(mask.shape), mask),
    )

"""PPO clipped surrogate (asymmetric clip-higher, dual clip), clipped value loss and loss aggregation.

Aggregation modes use verl's names. Which one reproduces which recipe:
vanilla GRPO = ``seq-mean-token-mean``, DAPO = ``token-mean`` (the default), Dr.GRPO =
``seq-mean-token-sum-norm`` (with ``scale="none"`` advantages).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.masked import masked_mean, masked_sum

__all__ = [
    "LOSS_AGG_MODES",
    "PolicyLossStats",
    "aggregate_loss",
    "clipped_token_masks",
    "policy_loss",
    "value_loss",
]


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


LOSS_AGG_MODES: tuple[str, ...] = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")

# The log-ratio is clamped before exp() (as verl does) so that a stale or garbage log-prob cannot
# overflow the ratio; outside [-20, 20] the ratio is constant and carries no gradient.
_LOG_RATIO_CLAMP = 20.0


class PolicyLossStats(NamedTuple):
    """Detached scalar diagnostics of one policy-loss call; fractions are over valid tokens.

    Attributes:
        clip_frac_low: ``ratio < 1 - eps_low`` with ``A < 0`` (lower clip binds).
        clip_frac_high: ``ratio > 1 + eps_high`` with ``A > 0`` (upper clip binds).
        clip_frac: either of the two.
        dual_clip_frac: ``A < 0`` and ``ratio > dual_clip_c`` (the dual clip binds; 0 when off).
        approx_kl: masked mean of ``k3`` for KL(old || new): ``ratio - 1 - log(ratio)`` (>= 0).
        ratio_mean: masked mean of the importance ratio.
    """

    clip_frac_low: Tensor
    clip_frac_high: Tensor
    clip_frac: Tensor
    dual_clip_frac: Tensor
    approx_kl: Tensor
    ratio_mean: Tensor


def _as_bool(mask: Tensor) -> Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def _compute_dtype(*tensors: Tensor) -> torch.dtype:
    """At least float32: bf16/fp16 log-probs lose the small ratio deviations PPO cares about."""
    dtype = torch.float32
    for t in tensors:
        if t.dtype == torch.float64:
            dtype = torch.float64
    return dtype


def _check_positive(name: str, value: float | None) -> None:
    if value is not None and isinstance(value, (int, float)) and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}")


def aggregate_loss(
    per_token_loss: Tensor,
    mask: Tensor,
    loss_agg_mode: str = "token-mean",
    *,
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> Tensor:
    """Reduce a per-token loss ``[B, T]`` to a scalar (verl's ``agg_loss`` semantics).

    - ``token-mean``: sum over valid tokens / number of valid tokens.
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

    Returns:
        Scalar tensor (0 when nothing is valid).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if per_token_loss.shape != mask.shape or per_token_loss.dim() != 2:
        raise ValueError(
            f"per_token_loss {tuple(per_token_loss.shape)} and mask {tuple(mask.shape)} must share one [B, T] shape"
        )
    _check_positive("normalizer", normalizer)
    _check_positive("loss_scale_factor", loss_scale_factor)
    mask = _as_bool(mask)
    dtype = per_token_loss.dtype
    if loss_agg_mode == "token-mean":
        total = masked_sum(per_token_loss, mask)
        count = mask.sum()
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


def policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float = 0.2,
    clip_ratio_high: float = 0.2,
    dual_clip_c: float | None = None,
    loss_agg_mode: str = "token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[Tensor, PolicyLossStats]:
    """PPO clipped surrogate with asymmetric (clip-higher) ratio bounds and optional dual clip.

    Per token, with ``r = exp(clamp(logp - old, -20, 20))``:
    ``loss = max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high))``; with ``dual_clip_c = c`` and
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
        dual_clip_c: dual-clip constant ``> 1`` or None (off).
        loss_agg_mode: see :func:`aggregate_loss`.
        normalizer: global denominator, see :func:`aggregate_loss`.
        loss_scale_factor: constant of ``seq-mean-token-sum-norm``.

    Returns:
        ``(loss, stats)``: scalar loss (float32 or float64) and :class:`PolicyLossStats`.
    """
    for name, eps in (("clip_ratio_low", clip_ratio_low), ("clip_ratio_high", clip_ratio_high)):
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
            raise ValueError(f"{name} must be a finite number >= 0, got {eps!r}")
    if dual_clip_c is not None and not (isinstance(dual_clip_c, (int, float)) and dual_clip_c > 1):
        raise ValueError(f"dual_clip_c must be > 1 or None, got {dual_clip_c!r}")
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"loss_agg_mode must be one of {LOSS_AGG_MODES}, got {loss_agg_mode!r}")
    if logprobs.shape != old_logprobs.shape or logprobs.shape != mask.shape or logprobs.dim() != 2:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, old_logprobs {tuple(old_logprobs.shape)} and mask "
            f"{tuple(mask.shape)} must share one [B, T] shape"
        )
    if advantages.shape == logprobs.shape[:1]:
        advantages = advantages.unsqueeze(-1)
    elif advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} must be {tuple(logprobs.shape)} or {tuple(logprobs.shape[:1])}"
        )
    mask = _as_bool(mask)
    dtype = _compute_dtype(logprobs, old_logprobs, advantages)
    zero = torch.zeros((), dtype=dtype, device=logprobs.device)
    adv = torch.where(mask, advantages.detach().to(dtype), zero)
    log_ratio = torch.where(mask, logprobs.to(dtype) - old_logprobs.detach().to(dtype), zero)
    log_ratio = log_ratio.clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)

    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip_c is not None:
        per_token = torch.where(adv < 0, torch.minimum(per_token, -adv * dual_clip_c), per_token)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, normalizer=normalizer, loss_scale_factor=loss_scale_factor)

    with torch.no_grad():
        r = ratio.detach()
        low, high = clipped_token_masks(r, adv, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
        dual = (adv < 0) & (r > dual_clip_c) if dual_clip_c is not None else torch.zeros_like(mask)
        lr = log_ratio.detach()
        stats = PolicyLossStats(
            clip_frac_low=masked_mean(low.to(dtype), mask),
            clip_frac_high=masked_mean(high.to(dtype), mask),
            clip_frac=masked_mean((low | high).to(dtype), mask),
            dual_clip_frac=masked_mean(dual.to(dtype), mask),
            approx_kl=masked_mean(r - 1.0 - lr, mask),
            ratio_mean=masked_mean(r, mask),
        )
    return loss, stats


def value_loss(
    values: Tensor,
    old_values: Tensor,
    returns: Tensor,
    mask: Tensor,
    *,
    clip_range_value: float | None = 0.2,
    loss_agg_mode: str = "token-mean",
    normalizer: float | Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """PPO clipped value loss ``0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2)``, aggregated.

    Args:
        values: current critic values ``[B, T]`` (differentiable).
        old_values: critic values at rollout time ``[B, T]`` (detached inside).
        returns: targets ``[B, T]`` (detached inside).
        mask: ``[B, T]`` bool.
        clip_range_value: ``c >= 0``; None disables clipping (plain 0.5 squared error).
        loss_agg_mode: see :func:`aggregate_loss`.
        normalizer: global denominator, see :func:`aggregate_loss`.

    Returns:
        ``(loss, clip_frac)``: scalar loss and the detached fraction of valid tokens where the
        clipped term is strictly larger (the clip binds).
    """
    if clip_range_value is not None and not (
        isinstance(clip_range_value, (int, float)) and math.isfinite(clip_range_value) and clip_range_value >= 0
    ):
        raise ValueError(f"clip_range_value must be a finite number >= 0 or None, got {clip_range_value!r}")
    if not (values.shape == old_values.shape == returns.shape == mask.shape) or values.dim() != 2:
        raise ValueError(
            f"values {tuple(values.shape)}, old_values {tuple(old_values.shape)}, returns {tuple(returns.shape)} "
            f"and mask {tuple(mask.shape)} must share one [B, T] shape"
        )
    mask = _as_bool(mask)
    dtype = _compute_dtype(values, old_values, returns)
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
    loss = 0.5 * aggregate_loss(per_token, mask, loss_agg_mode, normalizer=normalizer)
    return loss, frac

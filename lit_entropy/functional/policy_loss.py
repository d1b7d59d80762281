"""PPO clipped surrogate (asymmetric clip-higher, dual clip), clipped value loss and loss aggregation.

Aggregation modes use verl's names. Which one reproduces which recipe:
vanilla GRPO = ``seq-mean-token-mean``, DAPO = ``token-mean`` (the default), Dr.GRPO =
``seq-mean-token-sum-norm`` (with ``scale="none"`` advantages).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.masked import as_bool_mask, compute_dtype, masked_mean, masked_sum
from lit_entropy.functional.registry import register_policy_loss

__all__ = [
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "PolicyLossStats",
    "aggregate_loss",
    "check_policy_loss_args",
    "check_value_loss_args",
    "clipped_token_masks",
    "loss_normalizer_count",
    "policy_loss",
    "ppo_policy_loss",
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


LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-sum-norm",
)

# The log-ratio is clamped before exp() (as verl does) so that a stale or garbage log-prob cannot
# overflow the ratio; outside [-20, 20] the ratio is constant and carries no gradient.
LOG_RATIO_CLAMP = 20.0


def check_policy_loss_args(
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
    prefix: str = "",
) -> None:
    """Validate the arguments of :func:`policy_loss`; ``prefix`` turns names into setting names (``model.loss.``).

    Raises:
        ValueError: ``clip_ratio_low`` outside ``[0, 1)``, ``clip_ratio_high`` not ``>= 0``, ``clip_ratio_c``
            not ``> 1`` (or None), an unknown ``loss_agg_mode``, a non-positive ``loss_scale_factor``.
    """
    check_number(f"{prefix}clip_ratio_low", clip_ratio_low, low=0.0, high=1.0, high_open=True)
    check_number(f"{prefix}clip_ratio_high", clip_ratio_high, low=0.0)
    check_number(f"{prefix}clip_ratio_c", clip_ratio_c, low=1.0, low_open=True, optional=True)
    check_choice(f"{prefix}loss_agg_mode", loss_agg_mode, LOSS_AGG_MODES)
    check_number(f"{prefix}loss_scale_factor", loss_scale_factor, low=0.0, low_open=True, optional=True)


def check_value_loss_args(*, clip_range_value: float | None, prefix: str = "") -> None:
    """Validate :func:`value_loss`'s clip range: a finite number > 0, or None (no clipping)."""
    check_number(f"{prefix}clip_range_value", clip_range_value, low=0.0, low_open=True, optional=True)


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


def _check_positive(name: str, value: float | None) -> None:
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
    advantages = _token_advantages(logprobs, old_logprobs, advantages, mask)
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
    agg = {"normalizer": normalizer, "loss_scale_factor": loss_scale_factor, "token_weights": token_weights}
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    return loss, _policy_loss_stats(log_ratio, ratio, adv, mask, clip_ratio_low, clip_ratio_high, clip_ratio_c)


def _token_advantages(logprobs: Tensor, old_logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """Check the shapes of :func:`policy_loss`'s inputs; per-sequence advantages ``[B]`` become ``[B, 1]``."""
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

"""Rollout correction: importance weights between the rollout engine's and the trainer's log-probs, and the
mismatch metrics between the two.

The engine that sampled a token (vLLM, or HF ``generate``) and the trainer's forward score it with different
kernels, precision and sometimes another distribution (top-p / top-k). Off-policy correction weighs each
token's policy-loss term by ``w = pi_trainer / pi_rollout`` (verl's rollout correction, TRL's
``vllm_importance_sampling_*``, slime's TIS, IcePop's masking), at one of three levels:

- ``token``: ``w_t = exp(logp_t - logq_t)`` per token;
- ``sequence``: ``w_i = exp(sum_t (logp_t - logq_t))``, one weight per sequence, on each of its tokens;
- ``geometric``: ``w_i = exp(mean_t (logp_t - logq_t))``, the per-sequence geometric mean of the token weights.

The log-weight is clamped to ``[-20, 20]`` before ``exp`` (as verl does) so that a sequence-level sum cannot
overflow. Two modes: ``truncate`` (``min(w, upper)``, truncated IS) and ``mask`` (``w`` inside
``[lower, upper]``, 0 outside: the token or sequence leaves the loss's numerator, IcePop-style; it still counts
in the loss's denominator). The weights multiply the per-token policy-loss term, never the advantages.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.masked import as_bool_mask, masked_mean, masked_sum

__all__ = [
    "MISMATCH_SUMS",
    "ROLLOUT_CORRECTION_LEVELS",
    "ROLLOUT_CORRECTION_MODES",
    "RolloutCorrection",
    "check_rollout_correction_args",
    "kept_log_mass",
    "mismatch_metrics",
    "mismatch_sums",
    "rollout_correction",
    "rollout_log_weights",
]

ROLLOUT_CORRECTION_LEVELS: tuple[str, ...] = ("token", "sequence", "geometric")
ROLLOUT_CORRECTION_MODES: tuple[str, ...] = ("truncate", "mask")
#: Bound of the log-weight before ``exp`` (``exp(20)`` ~ 5e8 stays finite in float32).
LOG_WEIGHT_CLAMP = 20.0
MISMATCH_SUMS: tuple[str, ...] = (
    "tokens", "k1", "k3", "sequences", "ppl_ratio", "units", "weight", "weight_sq", "above", "below",
)  # fmt: skip
"""The entries of :func:`mismatch_sums`, in order: each adds up across shards (a SUM all-reduce)."""


def check_rollout_correction_args(
    *, level: str, mode: str, upper: float, lower: float | None = None, prefix: str = ""
) -> None:
    """Validate :func:`rollout_correction`'s options; ``prefix`` makes them setting names.

    Raises:
        ValueError: an unknown level or mode, ``upper`` not a finite number > 0, ``lower`` not in ``[0, upper)``.
    """
    check_choice(f"{prefix}level", level, ROLLOUT_CORRECTION_LEVELS)
    check_choice(f"{prefix}mode", mode, ROLLOUT_CORRECTION_MODES)
    check_number(f"{prefix}upper", upper, low=0.0, low_open=True)
    check_number(f"{prefix}lower (upper={upper})", lower, low=0.0, high=upper, high_open=True, optional=True)


def _valid_rows(mask: Tensor) -> Tensor:
    return mask.any(dim=-1)


def rollout_log_weights(trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, level: str) -> Tensor:
    """Log importance weights ``[N, T]`` (float32, or float64 for float64 input), 0 outside ``mask``.

    Args:
        trainer_logprobs: ``[N, T]`` the trainer's log-probs of the sampled tokens (the behaviour policy ``pi_old``).
        rollout_logprobs: ``[N, T]`` the engine's log-probs of the same tokens.
        mask: ``[N, T]`` bool, the valid response tokens.
        level: ``token``, ``sequence`` (sum over the row's tokens) or ``geometric`` (their mean), broadcast.
    """
    check_choice("level", level, ROLLOUT_CORRECTION_LEVELS)
    if not trainer_logprobs.shape == rollout_logprobs.shape == mask.shape or mask.dim() != 2:
        raise ValueError(
            f"trainer_logprobs {tuple(trainer_logprobs.shape)}, rollout_logprobs {tuple(rollout_logprobs.shape)} and "
            f"mask {tuple(mask.shape)} must share one [N, T] shape"
        )
    mask = as_bool_mask(mask)
    dtype = torch.float64 if torch.float64 in (trainer_logprobs.dtype, rollout_logprobs.dtype) else torch.float32
    zero = torch.zeros((), dtype=dtype, device=mask.device)
    gap = torch.where(mask, trainer_logprobs.detach().to(dtype) - rollout_logprobs.detach().to(dtype), zero)
    if level == "sequence":
        gap = gap.sum(-1, keepdim=True).expand_as(gap)
    elif level == "geometric":
        gap = masked_mean(gap, mask, dim=-1).unsqueeze(-1).expand_as(gap)
    return torch.where(mask, gap.clamp(-LOG_WEIGHT_CLAMP, LOG_WEIGHT_CLAMP), zero)


class RolloutCorrection(NamedTuple):
    """Result of :func:`rollout_correction`, all ``[N, T]`` and False / 0 outside the mask.

    Attributes:
        weights: the weights that multiply the per-token policy-loss term (detached).
        raw: the uncorrected weights ``exp(log w)``.
        above: ``raw > upper`` (truncated, or masked, from above).
        below: ``raw < lower`` (masked from below; under ``truncate`` only counted).
    """

    weights: Tensor
    raw: Tensor
    above: Tensor
    below: Tensor


def rollout_correction(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    *,
    level: str = "token",
    mode: str = "truncate",
    upper: float = 2.0,
    lower: float | None = None,
) -> RolloutCorrection:
    """Importance weights of the trainer's over the rollout engine's distribution, truncated or masked.

    Args:
        trainer_logprobs, rollout_logprobs, mask: see :func:`rollout_log_weights`.
        level: ``token``, ``sequence`` or ``geometric``.
        mode: ``truncate`` (``min(w, upper)``) or ``mask`` (``w`` where ``lower <= w <= upper``, else 0).
        upper: the upper bound (> 0).
        lower: the lower bound in ``[0, upper)``; None = ``1 / upper`` (when below ``upper``, else 0).

    Returns:
        A :class:`RolloutCorrection`.
    """
    check_rollout_correction_args(level=level, mode=mode, upper=upper, lower=lower)
    mask = as_bool_mask(mask)
    raw = torch.where(mask, rollout_log_weights(trainer_logprobs, rollout_logprobs, mask, level).exp(), 0.0)
    low = default_lower(upper) if lower is None else lower
    above, below = mask & (raw > upper), mask & (raw < low)
    weights = raw.clamp(max=upper) if mode == "truncate" else torch.where(above | below, 0.0, raw)
    return RolloutCorrection(weights=weights, raw=raw, above=above, below=below)


def default_lower(upper: float) -> float:
    """``1 / upper`` when that is below ``upper`` (upper > 1), else 0."""
    return 1.0 / upper if upper > 1.0 else 0.0


def mismatch_sums(
    trainer_logprobs: Tensor,
    rollout_logprobs: Tensor,
    mask: Tensor,
    correction: RolloutCorrection | None = None,
    *,
    level: str = "token",
) -> Tensor:
    """The float64 sums behind :func:`mismatch_metrics` (:data:`MISMATCH_SUMS`), which add up across shards.

    The mismatch is KL(rollout || trainer) estimated on the rollout's own samples with ``d = logq - logp``:
    ``k1 = d`` and ``k3 = exp(-d) - 1 + d`` per token; the perplexity ratio is the rollout's over the trainer's
    perplexity per sequence, ``exp(mean_t (logp - logq))``; the weights' effective sample size, and the
    fractions above / below the bounds, count ``level``'s units (tokens, or sequences with a valid token).

    Args:
        trainer_logprobs, rollout_logprobs, mask: see :func:`rollout_log_weights`.
        correction: the applied weights (their ESS and bound fractions are counted); None = the raw token
            (or ``level``) weights, no bounds.
        level: the unit of the weights.
    """
    mask = as_bool_mask(mask)
    log_w = rollout_log_weights(trainer_logprobs, rollout_logprobs, mask, "token").double()
    rows = _valid_rows(mask)
    k3 = log_w.exp() - 1.0 - log_w
    ppl_ratio = torch.where(rows, masked_mean(log_w, mask, dim=-1).exp(), 0.0)
    if correction is None:
        raw = rollout_log_weights(trainer_logprobs, rollout_logprobs, mask, level).double().exp()
        correction = RolloutCorrection(raw, raw, torch.zeros_like(mask), torch.zeros_like(mask))
    # Per-unit values: every token at token level, the first valid token of each row otherwise (all equal).
    units = mask if level == "token" else mask & (mask.long().cumsum(-1) == 1)
    weights = correction.weights.double()
    parts = [
        mask.sum(),
        masked_sum(-log_w, mask),
        masked_sum(k3, mask),
        rows.sum(),
        ppl_ratio.sum(),
        units.sum(),
        masked_sum(weights, units),
        masked_sum(weights.square(), units),
        (correction.above & units).sum(),
        (correction.below & units).sum(),
    ]
    return torch.stack([torch.as_tensor(p, dtype=torch.float64, device=mask.device) for p in parts])


def mismatch_metrics(sums: Tensor) -> dict[str, float]:
    """``kl_k1``, ``kl_k3`` (token means), ``ppl_ratio`` (sequence mean), ``ess`` (``(sum w)^2 / (n sum w^2)`` in
    ``(0, 1]``, 1 for equal weights) and ``frac_above`` / ``frac_below`` from :func:`mismatch_sums` (summed over
    shards). Everything is 0 (ESS and the perplexity ratio 1) when the two sides agree, or nothing is valid."""
    s = dict(zip(MISMATCH_SUMS, sums.double().tolist(), strict=True))
    tokens, sequences, units = max(s["tokens"], 1.0), max(s["sequences"], 1.0), max(s["units"], 1.0)
    if not s["units"]:
        ess = 1.0
    else:  # every weight 0 (all masked): no effective sample left
        ess = s["weight"] ** 2 / (s["units"] * s["weight_sq"]) if s["weight_sq"] > 0 else 0.0
    return {
        "kl_k1": s["k1"] / tokens,
        "kl_k3": s["k3"] / tokens,
        "ppl_ratio": s["ppl_ratio"] / sequences if s["sequences"] else 1.0,
        "ess": ess,
        "frac_above": s["above"] / units,
        "frac_below": s["below"] / units,
    }


def kept_log_mass(scores: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """``log`` of the probability mass that top-k then top-p keep of ``softmax(scores)``, per row ``[...]``.

    The kept set is Hugging Face's and vLLM's: top-k keeps every token scoring at least the k-th highest score
    (ties kept); top-p, on the top-k-renormalised distribution sorted ascending, drops the tokens whose
    cumulative probability is ``<= 1 - top_p`` (the most likely token always stays). A log-prob of the full
    ``softmax(scores)`` minus this is the log-prob renormalised over the kept set, the distribution an engine
    with those filters samples from.

    Args:
        scores: ``[..., V]`` temperature-scaled logits (float32 or float64; computed in at least float32).
        top_k: keep the k best tokens; 0 = all.
        top_p: nucleus mass in ``(0, 1]``; 1 = all.
    """
    scores = scores.float() if scores.dtype not in (torch.float32, torch.float64) else scores
    full = torch.logsumexp(scores, dim=-1)
    kept = scores
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        kept = kept.masked_fill(kept < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(kept, dim=-1)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1.0 - top_p
        drop[..., -1] = False
        kept = kept.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return torch.logsumexp(kept, dim=-1) - full

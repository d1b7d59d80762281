"""Entropy-discriminator clipping: the Clip_B and Clip_V loss masks (THEORY.md §3).

Both methods run once per training step on the whole rollout batch and only change the loss
mask: the functions return the *keep* mask (True = the token stays in the policy loss and in
its token-count denominator), always a subset of ``mask``. Advantages are never changed.

Statistics come from the float64 moments ``(count, sum, sum of squares)`` of a per-token
score over the valid tokens. A single-process caller lets the functions compute them locally;
a distributed caller all-reduces ``masked_moments`` (and, for the Clip_V cap, finds the global
top-k cut of :mod:`lit_entropy.functional.selection.top_k`) across ranks and passes the global values in,
so every rank makes the decision the global batch would make. The steps are public for that purpose:

    moments = all_reduce(masked_moments(clip_v_deviation(S, E_p[S]), mask))       # SUM
    scores, cand = clip_v_scores(S, E_p[S], A, mask, mu=mu, moments=moments)
    cut = <global TopKCut of (scores, cand) for k = cap_count(int(moments[0]), max_frac)>
    keep = clip_v_mask(S, E_p[S], A, mask, moments=moments, cap_cut=cut)

Non-finite rule: a token whose score is NaN or +-inf (``S`` for Clip_B; ``D = E_p[S] - S``, i.e. ``S``
or ``E_p[S]`` non-finite, for Clip_V) is excluded from the statistics (count, mean, std, and the
``n`` of the Clip_V cap) and is never masked: it stays in the loss, where the module's non-finite
loss check sees it. The other tokens are clipped as if it were absent, so one NaN does not switch
clipping off for the batch. A distributed caller builds its moments over
``finite_mask(score, mask)``; :class:`~lit_entropy.callbacks.EntropyDiscriminatorClipping` does, and
logs the share of such tokens.

Zero-spread rule: the population standard deviation ``s`` is treated as zero (nothing is
masked) when ``var <= 1e-14 * E[x^2]``, i.e. ``s`` below ~1e-7 of the RMS of the score. That
is beneath float32 resolution of the per-token scores and inside the float64 cancellation
error of ``sumsq / n - mean^2``, so an all-equal batch never masks tokens by rounding noise.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_flag, check_fraction, check_number
from lit_entropy.functional.masked import masked_moments
from lit_entropy.functional.selection.top_k import TopKCut, top_k_cut, top_k_mask

__all__ = [
    "cap_count",
    "check_clip_b_args",
    "check_clip_v_args",
    "check_max_frac",
    "clip_b_mask",
    "finite_mask",
    "clip_v_deviation",
    "clip_v_mask",
    "clip_v_scores",
    "moment_stats",
]

# var <= _ZERO_VAR_REL * E[x^2]  ->  s is treated as 0 (see the module docstring).
_ZERO_VAR_REL = 1e-14
# Tolerance in floor(max_frac * n) so that decimal fractions (0.29 * 100) are not rounded down.
_CAP_FLOOR_TOL = 1e-9


def check_max_frac(max_frac: float | None, *, optional: bool = True) -> float | None:
    """Clip_V's cap ``max_frac``: a share of the valid tokens in ``(0, 1]``, or None (no cap) when ``optional``."""
    frac: float | None = check_fraction("max_frac", max_frac, optional=optional)
    return frac


def check_clip_b_args(mu: float, symmetric: bool = False) -> None:
    """Refuse a Clip_B argument the mask cannot use: ``mu`` a finite number > 0, ``symmetric`` a bool.

    :func:`clip_b_mask` and :class:`~lit_entropy.callbacks.EntropyDiscriminatorClipping` both call it.
    """
    check_number("mu", mu, low=0, low_open=True)
    check_flag("symmetric", symmetric)


def check_clip_v_args(mu: float, max_frac: float | None = None, symmetric: bool = False) -> None:
    """Refuse a Clip_V argument: those of :func:`check_clip_b_args` and ``max_frac`` (:func:`check_max_frac`)."""
    check_clip_b_args(mu, symmetric)
    check_max_frac(max_frac)


def _as_bool_mask(mask: Tensor, shape: torch.Size) -> Tensor:
    if mask.shape != shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match discriminator shape {tuple(shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def _broadcast_advantages(advantages: Tensor, shape: torch.Size) -> Tensor:
    """Per-token ``[B, T]`` advantages, or per-sequence ``[B]`` ones broadcast over tokens."""
    if advantages.shape == shape:
        return advantages
    if len(shape) == 2 and advantages.shape == shape[:1]:
        return advantages.unsqueeze(-1).expand(shape)
    raise ValueError(
        f"advantages shape {tuple(advantages.shape)} must be {tuple(shape)} (per token) or {tuple(shape[:1])} "
        "(per sequence)"
    )


def finite_mask(values: Tensor, mask: Tensor) -> Tensor:
    """The tokens of ``mask`` whose ``values`` are finite: those the statistics count (module docstring)."""
    return mask & torch.isfinite(values)


def _check_moments(moments: Tensor | None, values: Tensor, mask: Tensor) -> Tensor:
    if moments is None:
        return masked_moments(values, finite_mask(values, mask))
    if moments.numel() != 3:
        raise ValueError(f"moments must hold (count, sum, sumsq), got shape {tuple(moments.shape)}")
    return moments.detach().reshape(3).to(device=values.device, dtype=torch.float64)


def moment_stats(moments: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Count, mean and population std from float64 moments ``(count, sum, sumsq)``.

    ``var = sumsq / n - mean^2`` clamped at 0; the std is returned as exactly 0 under the
    module's zero-spread rule, and everything is 0 when ``n == 0``.

    Returns:
        ``(n, mean, std)`` float64 scalar tensors.
    """
    moments = moments.to(torch.float64)
    n, total, sumsq = moments[0], moments[1], moments[2]
    safe_n = n.clamp(min=1.0)
    mean = total / safe_n
    mean_sq = sumsq / safe_n
    var = (mean_sq - mean.square()).clamp(min=0.0)
    var = torch.where(var <= _ZERO_VAR_REL * mean_sq, torch.zeros_like(var), var)
    return n, mean, var.sqrt()


def clip_b_mask(
    discriminator: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    mu: float = 2.5,
    symmetric: bool = False,
    moments: Tensor | None = None,
) -> Tensor:
    """Clip_B keep mask: drop negative-advantage tokens whose discriminator is far below the batch mean.

    With ``m`` and ``s`` the mean and population std of ``S`` over the valid tokens, a token is
    masked when ``A < 0`` and ``S - m < -mu * s``; with ``symmetric=True`` also when ``A > 0``
    and ``S - m > mu * s``. Nothing is masked when ``s`` is ~0 (module docstring).

    Args:
        discriminator: ``S = p_k (H + log p_k)`` per token, ``[B, T]`` (from the old policy).
        advantages: ``[B, T]`` or per-sequence ``[B]``.
        mask: ``[B, T]`` bool, True = valid response token.
        mu: threshold in standard deviations (> 0).
        symmetric: also mask the strongest entropy-decreasing positive-advantage tokens.
        moments: optional float64 ``[3]`` ``(count, sum, sumsq)`` of ``S`` over the finite valid tokens
            of the global batch (already all-reduced); replaces the local statistics.

    Returns:
        Bool ``[B, T]`` keep mask, a subset of ``mask``.
    """
    check_clip_b_args(mu, symmetric)
    mask = _as_bool_mask(mask, discriminator.shape)
    adv = _broadcast_advantages(advantages, discriminator.shape)
    _, mean, std = moment_stats(_check_moments(moments, discriminator, mask))
    centred = discriminator.detach().to(torch.float64) - mean
    threshold = mu * std
    clipped = (adv < 0) & (centred < -threshold)
    if symmetric:
        clipped |= (adv > 0) & (centred > threshold)
    # std == 0 makes the threshold 0; the strict comparisons could still fire on rounding noise of the mean.
    clipped &= std > 0
    clipped &= torch.isfinite(centred)  # non-finite tokens are never masked (module docstring)
    return mask & ~clipped


def clip_v_deviation(discriminator: Tensor, policy_average: Tensor) -> Tensor:
    """Clip_V per-token score ``D = E_p[S] - S`` in float64 (detached), ``[B, T]``."""
    if discriminator.shape != policy_average.shape:
        raise ValueError(
            f"policy_average shape {tuple(policy_average.shape)} does not match discriminator shape "
            f"{tuple(discriminator.shape)}"
        )
    return policy_average.detach().to(torch.float64) - discriminator.detach().to(torch.float64)


def clip_v_scores(
    discriminator: Tensor,
    policy_average: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    mu: float = 8.5,
    symmetric: bool = False,
    moments: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Clip_V ranking scores and candidate tokens, before the cap.

    ``s`` is the population std of ``D`` over the valid tokens; ``D`` itself is compared to the
    threshold without re-centring (its mean is ~0 on-policy). Candidates are valid tokens with
    ``A < 0`` and ``D > mu * s`` (score ``D``) and, with ``symmetric=True``, valid tokens with
    ``A > 0`` and ``-D > mu * s`` (score ``-D``). Tokens with a non-finite ``D`` are never candidates.

    Args:
        discriminator: ``S`` per token, ``[B, T]``.
        policy_average: ``E_p[S]`` per token, ``[B, T]``.
        advantages: ``[B, T]`` or ``[B]``.
        mask: ``[B, T]`` bool.
        mu: threshold in standard deviations (> 0).
        symmetric: also consider positive-advantage tokens.
        moments: optional float64 ``[3]`` global moments of ``D`` (see :func:`clip_v_deviation`).

    Returns:
        ``(scores, candidates)``: float64 ``[B, T]`` score (``-D`` where ``A > 0``, ``D``
        elsewhere) and the bool ``[B, T]`` candidate set (subset of ``mask``).
    """
    check_clip_b_args(mu, symmetric)  # max_frac is not an argument of the scores
    deviation = clip_v_deviation(discriminator, policy_average)
    mask = _as_bool_mask(mask, discriminator.shape)
    adv = _broadcast_advantages(advantages, discriminator.shape)
    _, _, std = moment_stats(_check_moments(moments, deviation, mask))
    threshold = mu * std
    positive = adv > 0
    scores = torch.where(positive, -deviation, deviation)
    eligible = (adv < 0) | positive if symmetric else adv < 0
    candidates = mask & eligible & (scores > threshold) & (std > 0) & torch.isfinite(deviation)
    return scores, candidates


def cap_count(num_valid: int, max_frac: float) -> int:
    """Clip_V cap: ``max(floor(max_frac * num_valid), 1)`` tokens at most.

    The floor has a 1e-9 tolerance so that a decimal fraction times a count that is an integer
    on paper (``0.29 * 100``) is not rounded down by binary floating point.
    """
    check_max_frac(max_frac, optional=False)
    num_valid = int(num_valid)
    if num_valid < 0:
        raise ValueError(f"num_valid must be >= 0, got {num_valid}")
    return max(math.floor(max_frac * num_valid + _CAP_FLOOR_TOL), 1)


def clip_v_mask(
    discriminator: Tensor,
    policy_average: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    mu: float = 8.5,
    max_frac: float | None = 1e-4,
    symmetric: bool = False,
    moments: Tensor | None = None,
    cap_cut: TopKCut | None = None,
) -> Tensor:
    """Clip_V keep mask: drop negative-advantage tokens whose ``D = E_p[S] - S`` exceeds ``mu * s``, capped.

    Candidates come from :func:`clip_v_scores`. At most ``max(floor(max_frac * n), 1)`` of the
    ``n`` valid tokens are masked: when more qualify, the candidates with the largest scores go,
    ranked all together. **Ties at the cap** are broken by global token index (row-major, lower
    ranks first; :mod:`lit_entropy.functional.selection.top_k`), so exactly the cap is masked and the
    result is identical under any sharding.

    Args:
        discriminator: ``S`` per token, ``[B, T]``.
        policy_average: ``E_p[S]`` per token, ``[B, T]``.
        advantages: ``[B, T]`` or ``[B]``.
        mask: ``[B, T]`` bool.
        mu: threshold in standard deviations (> 0).
        max_frac: largest masked fraction of the valid tokens, in (0, 1]; None = no cap.
        symmetric: also mask positive-advantage tokens with ``-D > mu * s``.
        moments: optional float64 ``[3]`` global moments of ``D`` over the finite valid tokens; its count
            is the ``n`` of the cap.
        cap_cut: optional global top-k cut of the candidate scores from a distributed caller
            (:class:`~lit_entropy.functional.selection.top_k.TopKCut`); computed locally when None.

    Returns:
        Bool ``[B, T]`` keep mask, a subset of ``mask``.
    """
    check_clip_v_args(mu, max_frac, symmetric)
    mask = _as_bool_mask(mask, discriminator.shape)
    moments = _check_moments(moments, clip_v_deviation(discriminator, policy_average), mask)
    scores, candidates = clip_v_scores(
        discriminator, policy_average, advantages, mask, mu=mu, symmetric=symmetric, moments=moments
    )
    if max_frac is not None:
        if cap_cut is None:
            cap_cut = top_k_cut(scores, candidates, cap_count(int(moments[0].item()), max_frac))
        candidates = top_k_mask(scores, candidates, cap_cut)
    return mask & ~candidates

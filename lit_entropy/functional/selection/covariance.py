"""Token selection for Clip-Cov, KL-Cov and high-entropy (80/20) training, as pure tensor math.

Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", ported to
verl as ``policy_loss.loss_mode=clip_cov|kl_cov``) rank tokens by the centred covariance

    cov_i = (A_i - mean A) * (log p_i - mean log p)            (means over the valid tokens)

For a softmax policy the entropy change of a policy-gradient step is, per position, minus the
covariance between log p and the logit update (THEORY.md §2 in covariance form), so tokens with a
large positive ``cov`` (likely token rewarded, unlikely token penalised) are the ones that drive
entropy down. Clip-Cov drops a random few of them from the loss; KL-Cov puts an
``|log p - log p_old|`` penalty on the top few. High-entropy selection ("Beyond the 80/20 Rule")
keeps only the top-``rho`` entropy positions ("forking tokens").

Every function takes optional *global* statistics so that a distributed caller (all-reduce /
all-gather, see :mod:`lit_entropy.callbacks.entropy_control`) selects over the whole batch, not per
rank; without them the local tensors are the whole batch. All per-token tensors are ``[B, T]`` with
a bool ``mask`` (True = valid response token); flattening order is row-major.

Ties: KL-Cov and high-entropy selection are top-``k`` rules and select exactly ``k`` tokens, ties
broken by global token index (:mod:`lit_entropy.functional.selection.top_k`); an all-zero-advantage batch
(every ``cov`` = 0) therefore still penalises only ``k`` tokens. Clip-Cov needs no tie rule: it
draws exactly ``min(k, #candidates)`` candidates uniformly, whatever their scores.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_fraction, check_number
from lit_entropy.functional.selection.top_k import TopKCut, top_k_cut, top_k_mask

__all__ = [
    "check_clip_cov_args",
    "check_clip_cov_bounds",
    "check_high_entropy_args",
    "check_kl_cov_args",
    "clip_cov_candidates",
    "clip_cov_mask",
    "covariance_scores",
    "high_entropy_count",
    "high_entropy_mask",
    "kl_cov_coefficients",
    "random_global_picks",
    "selection_count",
]


def _check_mask(mask: Tensor, shape: torch.Size, name: str = "mask") -> Tensor:
    if mask.shape != shape:
        raise ValueError(f"{name} shape {tuple(mask.shape)} does not match {tuple(shape)}")
    return mask if mask.dtype == torch.bool else mask != 0


def check_clip_cov_bounds(clip_cov_lb: float, clip_cov_ub: float) -> None:
    """Clip-Cov's covariance window: two finite numbers with ``clip_cov_lb < clip_cov_ub``."""
    check_number("clip_cov_lb", clip_cov_lb)
    check_number("clip_cov_ub", clip_cov_ub)
    if not clip_cov_lb < clip_cov_ub:
        raise ValueError(
            f"clip_cov_lb must be < clip_cov_ub (an empty covariance window selects nothing), "
            f"got clip_cov_lb={clip_cov_lb!r}, clip_cov_ub={clip_cov_ub!r}"
        )


def check_clip_cov_args(clip_cov_ratio: float, clip_cov_lb: float, clip_cov_ub: float) -> None:
    """Refuse a Clip-Cov argument: ``clip_cov_ratio`` in ``(0, 1]``, the window of :func:`check_clip_cov_bounds`.

    :func:`clip_cov_mask` and :class:`~lit_entropy.callbacks.ClipCov` both call it.
    """
    check_fraction("clip_cov_ratio", clip_cov_ratio)
    check_clip_cov_bounds(clip_cov_lb, clip_cov_ub)


def check_kl_cov_args(kl_cov_ratio: float, ppo_kl_coef: float) -> None:
    """Refuse a KL-Cov argument: ``kl_cov_ratio`` in ``(0, 1]``, ``ppo_kl_coef`` a finite number >= 0.

    :func:`kl_cov_coefficients` and :class:`~lit_entropy.callbacks.KLCov` both call it.
    """
    check_fraction("kl_cov_ratio", kl_cov_ratio)
    check_number("ppo_kl_coef", ppo_kl_coef, low=0)


def check_high_entropy_args(rho: float) -> None:
    """Refuse a high-entropy selection argument: the kept share ``rho`` in ``(0, 1]``.

    :func:`high_entropy_mask` and :class:`~lit_entropy.callbacks.HighEntropySelection` both call it.
    """
    check_fraction("rho", rho)


def selection_count(num_valid: int, ratio: float) -> int:
    """verl's token budget ``max(int(ratio * num_valid), 1)`` (at least one token, as verl does)."""
    check_fraction("ratio", ratio)
    if num_valid < 0:
        raise ValueError(f"num_valid must be >= 0, got num_valid={num_valid}")
    return max(int(ratio * int(num_valid)), 1)


def covariance_scores(
    advantages: Tensor,
    logprobs: Tensor,
    mask: Tensor,
    *,
    means: tuple[float, float] | Tensor | None = None,
) -> Tensor:
    """Per-token centred covariance ``(A - mean A) * (log p - mean log p)`` in float64, ``[B, T]``.

    Args:
        advantages: ``[B, T]`` per-token advantages.
        logprobs: ``[B, T]`` log-probabilities (nats) of the sampled tokens.
        mask: ``[B, T]`` bool, valid tokens; the means are over these.
        means: optional global ``(mean A, mean log p)`` over the valid tokens of all ranks;
            computed locally when None.

    Returns:
        float64 ``[B, T]`` (``-inf`` outside ``mask``, so it never ranks high).
    """
    if advantages.shape != logprobs.shape:
        raise ValueError(
            f"advantages shape {tuple(advantages.shape)} does not match logprobs shape {tuple(logprobs.shape)}"
        )
    mask = _check_mask(mask, logprobs.shape)
    adv = advantages.detach().to(torch.float64)
    logp = logprobs.detach().to(torch.float64)
    if means is None:
        n = mask.sum().clamp(min=1).to(torch.float64)
        mean_a = torch.where(mask, adv, 0.0).sum() / n
        mean_l = torch.where(mask, logp, 0.0).sum() / n
    else:
        mean_a, mean_l = (torch.as_tensor(m, dtype=torch.float64, device=adv.device) for m in means)
    cov = (adv - mean_a) * (logp - mean_l)
    return torch.where(mask, cov, torch.full_like(cov, -math.inf))


def clip_cov_candidates(cov: Tensor, mask: Tensor, *, lb: float = 1.0, ub: float = 5.0) -> Tensor:
    """Clip-Cov candidates: valid tokens with ``lb < cov < ub`` (strict, as in verl), bool ``[B, T]``."""
    check_clip_cov_bounds(lb, ub)
    mask = _check_mask(mask, cov.shape)
    return mask & (cov > lb) & (cov < ub)


def random_global_picks(total: int, k: int, offset: int, local: int, generator: torch.Generator) -> Tensor:
    """Which of this shard's candidates a global uniform draw of ``k`` out of ``total`` picks.

    Every rank draws the same permutation (same ``generator`` state), so the picks are the same
    as a single process drawing over the concatenated candidate list; this rank owns the global
    positions ``[offset, offset + local)``.

    Returns:
        int64 ``[m]`` sorted positions in ``[0, local)`` of the picked local candidates.
    """
    if min(total, k, offset, local) < 0 or offset + local > total:
        raise ValueError(f"need 0 <= offset, offset + local <= total, k >= 0; got {total=}, {k=}, {offset=}, {local=}")
    if total == 0 or k == 0:
        return torch.zeros(0, dtype=torch.long)
    picked = torch.randperm(total, generator=generator)[: min(k, total)]
    mine = picked[(picked >= offset) & (picked < offset + local)] - offset
    return torch.sort(mine).values


def clip_cov_mask(
    advantages: Tensor,
    logprobs: Tensor,
    mask: Tensor,
    *,
    ratio: float = 2e-4,
    lb: float = 1.0,
    ub: float = 5.0,
    generator: torch.Generator | None = None,
    means: tuple[float, float] | Tensor | None = None,
    num_valid: int | None = None,
    candidate_offset: int = 0,
    total_candidates: int | None = None,
) -> Tensor:
    """Clip-Cov keep mask: drop ``max(int(ratio * N), 1)`` random candidates (``lb < cov < ub``).

    Args:
        advantages: ``[B, T]``.
        logprobs: ``[B, T]`` log p of the sampled tokens (the rollout policy's, on-policy).
        mask: ``[B, T]`` bool.
        ratio: ``clip_cov_ratio`` in (0, 1]: share of the valid tokens to drop.
        lb: ``clip_cov_lb``.
        ub: ``clip_cov_ub``.
        generator: random source (identical state on all ranks); a fresh ``manual_seed(0)`` when None.
        means: global ``(mean A, mean log p)``; local when None.
        num_valid: global count ``N`` of valid tokens; local when None.
        candidate_offset: number of candidates on lower ranks (rank-major order).
        total_candidates: global number of candidates; local when None.

    Returns:
        bool ``[B, T]`` keep mask, a subset of ``mask``.
    """
    check_clip_cov_args(ratio, lb, ub)
    mask = _check_mask(mask, logprobs.shape)
    cov = covariance_scores(advantages, logprobs, mask, means=means)
    candidates = clip_cov_candidates(cov, mask, lb=lb, ub=ub)
    flat = torch.nonzero(candidates.reshape(-1), as_tuple=True)[0]
    n = int(mask.sum()) if num_valid is None else int(num_valid)
    total = flat.numel() if total_candidates is None else int(total_candidates)
    gen = generator if generator is not None else torch.Generator().manual_seed(0)
    picks = random_global_picks(total, selection_count(n, ratio), candidate_offset, flat.numel(), gen)
    keep = mask.clone().reshape(-1)
    keep[flat[picks.to(flat.device)]] = False
    return keep.reshape(mask.shape)


def kl_cov_coefficients(
    advantages: Tensor,
    logprobs: Tensor,
    mask: Tensor,
    *,
    ratio: float = 2e-3,
    coef: float = 1.0,
    means: tuple[float, float] | Tensor | None = None,
    cut: TopKCut | None = None,
) -> Tensor:
    """KL-Cov penalty coefficients: ``coef`` on the ``max(int(ratio * N), 1)`` largest-``cov`` tokens, else 0.

    **Ties** are broken by global token index (:mod:`lit_entropy.functional.selection.top_k`): exactly
    ``k`` tokens get the penalty, identically under any sharding.

    Args:
        advantages: ``[B, T]``.
        logprobs: ``[B, T]``.
        mask: ``[B, T]`` bool.
        ratio: ``kl_cov_ratio`` in (0, 1].
        coef: ``ppo_kl_coef`` (>= 0), the weight of ``|log p - log p_old|``.
        means: global ``(mean A, mean log p)``; local when None.
        cut: global top-``k`` cut of ``cov`` over the valid tokens (from a distributed caller); local when None.

    Returns:
        float32 ``[B, T]`` coefficients.
    """
    check_kl_cov_args(ratio, coef)
    mask = _check_mask(mask, logprobs.shape)
    cov = covariance_scores(advantages, logprobs, mask, means=means)
    if cut is None:
        cut = top_k_cut(cov, mask, selection_count(int(mask.sum()), ratio))
    return top_k_mask(cov, mask, cut).to(torch.float32) * float(coef)


def high_entropy_count(num_valid: int, rho: float) -> int:
    """Tokens kept by high-entropy selection: ``1 + floor(rho * (num_valid - 1))`` (0 when none is valid).

    This is how many tokens TRL's rule ``entropy >= (1 - rho)``-quantile (linear interpolation) keeps
    when all entropies differ; the floor has the 1e-9 tolerance of Clip_V's cap so that a decimal
    ``rho`` times an integer count is not rounded down by binary floating point.
    """
    check_high_entropy_args(rho)
    if num_valid < 0:
        raise ValueError(f"num_valid must be >= 0, got num_valid={num_valid}")
    return 0 if num_valid == 0 else 1 + math.floor(rho * (int(num_valid) - 1) + 1e-9)


def high_entropy_mask(entropy: Tensor, mask: Tensor, *, rho: float = 0.2, cut: TopKCut | None = None) -> Tensor:
    """Keep only the top-``rho`` entropy tokens: the :func:`high_entropy_count` highest-entropy valid tokens.

    TRL's ``top_entropy_quantile`` keeps ``entropy >= (1 - rho)``-quantile; without ties this is the
    same set. With ties it would keep every token tied at the quantile (a batch of mostly zero-entropy
    tokens would keep them all); here exactly the count is kept, ties broken by global token index.
    ``rho = 1`` keeps everything.

    Args:
        entropy: ``[B, T]`` per-position entropy (nats).
        mask: ``[B, T]`` bool.
        rho: kept share in (0, 1].
        cut: global top-``k`` cut of the entropies, ``k = high_entropy_count(global N, rho)``, from a
            distributed caller; local when None.

    Returns:
        bool ``[B, T]`` keep mask, a subset of ``mask``.
    """
    check_high_entropy_args(rho)
    mask = _check_mask(mask, entropy.shape)
    if cut is None:
        cut = top_k_cut(entropy, mask, high_entropy_count(int(mask.sum()), rho))
    return top_k_mask(entropy, mask, cut)

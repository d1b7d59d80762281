"""Policy losses with sequence-level importance ratios: GSPO, GSPO-token and GMPO.

Registered in :data:`~lit_entropy.functional.registry.POLICY_LOSSES` with the common signature and
returning :class:`~lit_entropy.functional.losses.ratio.PolicyLossStats`.

Which tokens do what (``N`` sequences, ``T`` tokens; ``response_mask`` are the valid response tokens, the
registry's extra, ``mask`` when absent; ``mask`` is the loss mask, the response narrowed by callbacks):

- a sequence's ratio *value* ``s_i = exp(mean_t log r_it)`` is taken over every valid response token: it is
  the importance weight of the sequence the old policy sampled, and the clip decides on it;
- a token a callback masks (Clip_B, Clip_V, Clip-Cov, 80/20, random masking) leaves the *gradient* and the
  loss: its log-ratio enters ``s_i`` detached, the gradient of ``log s_i`` is the mean of ``grad log pi``
  over the sequence's *loss* tokens, and the sequence's loss sits on its loss tokens only (the
  denominators count loss tokens, as under ``ppo``);
- without masks nothing changes (loss tokens = valid tokens); with them, ``gspo`` equals ``gspo_token``
  (per-sequence advantages) in loss and gradient under every ``loss_agg_mode``.

Why this choice (and not "a masked token leaves the ratio too"): a keep mask says *which tokens learn*;
it is not a statement about how far the sampled sequence is from the current policy. Taking the value over
the kept tokens only would make the trust region (the clip) of a sequence depend on which tokens a
callback kept, on a fifth of them under 80/20, on a random subset under random masking. Keeping masked
tokens in the gradient (the state before) would make the mask a no-op for these losses: the masked token
would still be pushed, through ``s_i``, by its sequence's advantage. With this choice, at the first
on-policy update (``s_i = 1``, no clip) every loss token gets ``A_i grad log pi_it`` times the same
aggregation weight as under ``ppo``, which is what the entropy dynamics (THEORY §2, the dynamics monitor)
assume for the tokens that stay in the loss.

``loss_agg_mode`` then aggregates the per-token values: ``seq-mean-token-mean`` is the papers' sequence
mean (every sequence counts once); ``token-mean`` weights each sequence by its number of loss tokens,
``token-sum`` / ``seq-mean-token-sum`` by that number without dividing by it, ``seq-mean-token-sum-norm``
by that number over the constant.

The dual clip (``clip_ratio_c``) is not part of these papers and is not applied (``dual_clip_frac`` is 0).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.losses.aggregation import aggregate_loss, aggregation_options
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_clip_ratios,
    clip_indicator_stats,
    clipped_token_masks,
    prepare_ratio_inputs,
)
from lit_entropy.functional.masked import as_bool_mask, masked_mean
from lit_entropy.functional.registry import register_policy_loss

__all__ = [
    "gmpo_policy_loss",
    "gspo_policy_loss",
    "gspo_token_policy_loss",
    "masked_sequence_log_ratio",
    "sequence_log_ratio",
]


#: The GSPO and GMPO papers' aggregation (each sequence counts once): a null ``model.loss.loss_agg_mode`` with them.
_PAPERS_AGGREGATION = "seq-mean-token-mean"


def sequence_log_ratio(log_ratio: Tensor, response_mask: Tensor) -> Tensor:
    """GSPO's length-normalised sequence log-ratio ``log s_i = mean_t log r_it`` over valid tokens, clamped.

    Args:
        log_ratio: ``[N, T]`` token log-ratios ``log pi - log pi_old``.
        response_mask: ``[N, T]`` bool, the sequence's valid tokens.

    Returns:
        ``[N]``, clamped to ``[-20, 20]`` (0 for a row without valid tokens).
    """
    return masked_mean(log_ratio, as_bool_mask(response_mask), dim=-1).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def masked_sequence_log_ratio(log_ratio: Tensor, response_mask: Tensor, mask: Tensor) -> Tensor:
    """``log s_i``: the value of :func:`sequence_log_ratio` over the valid tokens, the gradient of the loss tokens only.

    Value ``mean_{t valid} log r_it`` (clamped to ``[-20, 20]``); gradient ``mean_{t in mask} grad log r_it``
    (none once the clamp binds, none for a row without loss tokens). See the module docstring for why.

    Args:
        log_ratio: ``[N, T]`` token log-ratios (differentiable), 0 outside ``response_mask``.
        response_mask: ``[N, T]`` bool, the sequence's valid tokens.
        mask: ``[N, T]`` bool, the loss tokens (a subset of ``response_mask``).

    Returns:
        ``[N]``.
    """
    raw = masked_mean(log_ratio.detach(), as_bool_mask(response_mask), dim=-1)
    value = raw.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    kept = masked_mean(log_ratio, as_bool_mask(mask), dim=-1)
    inside = raw.abs() < LOG_RATIO_CLAMP
    return value + torch.where(inside, kept - kept.detach(), torch.zeros_like(kept))


@register_policy_loss("gspo", first_order_entropy=True, sequence_advantages=True, loss_agg_mode=_PAPERS_AGGREGATION)
def gspo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    response_mask: Tensor | None = None,
    token_weights: Tensor | None = None,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """GSPO (Zheng et al. 2025): clipped surrogate on the sequence ratio ``s_i = exp(mean_t log r_it)``.

    Per sequence ``l_i = max(-A_i s_i, -A_i clip(s_i, 1 - eps_low, 1 + eps_high))`` with ``A_i`` the mean
    advantage over the valid tokens (the sequence's advantage for outcome estimators); ``l_i`` sits on
    each token of ``mask`` and is aggregated by ``loss_agg_mode`` (see the module docstring).
    ``s_i``'s value is over the valid tokens, its gradient ``s_i mean_{t in mask} grad log pi_it`` over the
    loss tokens (:func:`masked_sequence_log_ratio`): a masked token gets no gradient.

    The ranges are the ones passed in; the paper (and verl's recipe) uses ``eps_low = 3e-4``,
    ``eps_high = 4e-4``: a sequence ratio moves far less than a token ratio, PPO's 0.2 never binds.

    Args:
        logprobs, old_logprobs: ``[N, T]`` current (differentiable) and behaviour log-probs.
        advantages: ``[N, T]`` or ``[N]``.
        mask: ``[N, T]`` bool loss mask.
        clip_ratio_low, clip_ratio_high: ``eps_low``, ``eps_high`` of the sequence ratio.
        clip_ratio_c: not read (no dual clip).
        loss_agg_mode, normalizer, loss_scale_factor: see :func:`~lit_entropy.functional.aggregate_loss`.
        response_mask: ``[N, T]`` bool valid response tokens (the ratio's tokens); ``mask`` when None.
        token_weights: ``[N, T]`` rollout-correction weights multiplying each token's loss term; None = 1.

    Returns:
        ``(loss, stats)``; clip fractions count the loss tokens of sequences whose clip binds.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high, loss_agg_mode, loss_scale_factor)
    mask, response, _, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, response_mask)
    seq_adv = masked_mean(adv, response, dim=-1)
    seq_ratio = torch.exp(masked_sequence_log_ratio(log_ratio, response, mask))
    clipped = seq_ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high)
    per_seq = torch.maximum(-seq_adv * seq_ratio, -seq_adv * clipped)
    per_token = per_seq.unsqueeze(-1).expand(mask.shape)
    agg = aggregation_options(normalizer, loss_scale_factor, token_weights)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    low, high = clipped_token_masks(
        seq_ratio.detach(), seq_adv, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high
    )
    broadcast = (low.unsqueeze(-1).expand(mask.shape), high.unsqueeze(-1).expand(mask.shape))
    return loss, clip_indicator_stats(*broadcast, seq_ratio.unsqueeze(-1), log_ratio, mask)


@register_policy_loss("gspo_token", first_order_entropy=True, loss_agg_mode=_PAPERS_AGGREGATION)
def gspo_token_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    response_mask: Tensor | None = None,
    token_weights: Tensor | None = None,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """GSPO-token: the clipped surrogate on ``s_it = sg[s_i] * pi_it / sg[pi_it]``, per token.

    ``s_it`` equals ``s_i`` in value but its gradient is ``s_i grad log pi_it``, so token-level advantages
    ``A_it`` are allowed; with a per-sequence advantage and ``seq-mean-token-mean`` its loss and gradient
    equal :func:`gspo_policy_loss`'s. Per token ``max(-A_it s_it, -A_it clip(s_it, 1 - eps_low, 1 + eps_high))``
    over ``mask``, aggregated by ``loss_agg_mode``. Arguments as :func:`gspo_policy_loss`.

    Returns:
        ``(loss, stats)``; clip fractions over the loss tokens (``s_i`` out of range with the sign of ``A_it``).
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high, loss_agg_mode, loss_scale_factor)
    mask, response, lp, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, response_mask)
    log_s = sequence_log_ratio(log_ratio, response).detach().unsqueeze(-1)
    ratio = torch.exp(lp - lp.detach() + log_s)
    per_token = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip_ratio_low, 1.0 + clip_ratio_high))
    agg = aggregation_options(normalizer, loss_scale_factor, token_weights)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    low, high = clipped_token_masks(ratio.detach(), adv, clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
    return loss, clip_indicator_stats(low, high, ratio, log_ratio, mask)


@register_policy_loss("gmpo", first_order_entropy=True, sequence_advantages=True, loss_agg_mode=_PAPERS_AGGREGATION)
def gmpo_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
    loss_agg_mode: str = "seq-mean-token-mean",
    normalizer: float | Tensor | None = None,
    loss_scale_factor: float | None = None,
    response_mask: Tensor | None = None,
    token_weights: Tensor | None = None,
    **extra: Any,
) -> tuple[Tensor, PolicyLossStats]:
    """GMPO (Zhao et al. 2025): the geometric mean of the token ratios, clipped token-wise in log space.

    Per token ``m_it = sgn(A) min(sgn(A) log r_it, sgn(A) clip(log r_it, -eps_low, eps_high))`` (the
    pessimistic side, as PPO's min, in log space); per sequence ``l_i = -A_i exp(mean_t m_it)`` over the
    valid tokens, i.e. ``-sgn(A_i) prod_t |min(r_it A_i, clip(r_it, e^-eps_low, e^eps_high) A_i)|^(1/|o_i|)``.
    ``sgn(A)`` is the token's advantage sign and ``A_i`` the mean advantage over the valid tokens (as
    verl). ``l_i`` sits on each token of ``mask``, aggregated by ``loss_agg_mode``. As under :func:`gspo_policy_loss`
    the mean's value is over the valid tokens and its gradient over the loss tokens: a masked token gets none.

    Here ``clip_ratio_low`` / ``clip_ratio_high`` are *log-space* bounds: the ratio range is
    ``[e^-eps_low, e^eps_high]`` (the paper uses 0.4 for both). Other arguments as :func:`gspo_policy_loss`.

    Returns:
        ``(loss, stats)``; clip fractions count the loss tokens where the log-space clip binds
        (``log r > eps_high`` with ``A > 0``, ``log r < -eps_low`` with ``A < 0``); ``ratio_mean`` is
        the mean of the clipped geometric-mean ratio.
    """
    check_clip_ratios(clip_ratio_low, clip_ratio_high, loss_agg_mode, loss_scale_factor)
    mask, response, _, log_ratio, adv = prepare_ratio_inputs(logprobs, old_logprobs, advantages, mask, response_mask)
    sign = torch.sign(adv)
    clamped = log_ratio.clamp(-clip_ratio_low, clip_ratio_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * clamped)
    geo_ratio = torch.exp(masked_sequence_log_ratio(pessimistic, response, mask))
    seq_adv = masked_mean(adv, response, dim=-1)
    per_token = (-seq_adv * geo_ratio).unsqueeze(-1).expand(mask.shape)
    agg = aggregation_options(normalizer, loss_scale_factor, token_weights)
    loss = aggregate_loss(per_token, mask, loss_agg_mode, **agg)
    r = log_ratio.detach()
    low = (adv < 0) & (r < -clip_ratio_low)
    high = (adv > 0) & (r > clip_ratio_high)
    return loss, clip_indicator_stats(low, high, geo_ratio.unsqueeze(-1), log_ratio, mask)

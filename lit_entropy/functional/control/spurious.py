"""STAPO's S2T: silence spurious tokens (arXiv 2602.15620, "Silencing Spurious Tokens").

Only the paper is public. Implemented: its S2T mask (Section 4, the spurious-token criterion and the masked,
renormalised objective): a valid token is spurious when all three hold

    A > 0,    p_old < tau_p,    H < tau_h,

with ``tau_p = 0.002`` and ``tau_h`` the batch's 80th entropy percentile (linear interpolation, as
``torch.quantile``); spurious tokens leave the loss and its token-count denominator (the objective is
renormalised over the kept tokens, which is what a lit_entropy keep mask does).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_number

__all__ = ["check_s2t_args", "interpolated_quantile", "s2t_mask"]


def check_s2t_args(prob_threshold: float, entropy_quantile: float) -> None:
    """Raise a ValueError naming the first bad S2T argument, its value and what is allowed."""
    check_number("prob_threshold", prob_threshold, low=0, high=1)
    check_number("entropy_quantile", entropy_quantile, low=0, high=1)


def interpolated_quantile(num_values: int, quantile: float) -> tuple[int, int, float]:
    """Where the linear-interpolated ``quantile`` of ``num_values`` sorted values falls: ``(k_low, k_high, frac)``.

    The quantile is ``v_low + frac (v_high - v_low)`` with ``v_low`` the ``k_low``-th *largest* value and ``v_high``
    the ``k_high``-th largest (``torch.quantile``'s ``linear`` rule stated with top-k ranks, so a sharded batch
    finds both with a global top-k). Needs ``num_values >= 1``.
    """
    position = quantile * (num_values - 1)
    below = math.floor(position)
    above = min(below + 1, num_values - 1)
    return num_values - below, num_values - above, position - below


def s2t_mask(
    logprobs: Tensor,
    entropy: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    prob_threshold: float = 0.002,
    entropy_quantile: float = 0.8,
    entropy_threshold: float | None = None,
) -> Tensor:
    """Keep mask ``[B, T]``: ``mask`` without the spurious tokens.

    Args:
        logprobs: ``[B, T]`` rollout log-probs of the sampled tokens.
        entropy: ``[B, T]`` entropy in nats at each position.
        advantages: ``[B, T]``.
        mask: ``[B, T]`` bool, valid tokens.
        prob_threshold: ``tau_p``: spurious tokens have ``p < tau_p``.
        entropy_quantile: ``tau_h`` is this quantile of the valid tokens' entropies (ignored when
            ``entropy_threshold`` is given).
        entropy_threshold: ``tau_h`` in nats, computed elsewhere (over all ranks); None computes it from these
            tokens with ``torch.quantile``.
    """
    check_s2t_args(prob_threshold, entropy_quantile)
    if not bool(mask.any()):
        return mask.clone()
    if entropy_threshold is None:
        entropy_threshold = float(torch.quantile(entropy.detach().to(torch.float64)[mask], entropy_quantile))
    spurious = (advantages > 0) & (logprobs.detach().exp() < prob_threshold) & (entropy < entropy_threshold)
    return mask & ~spurious

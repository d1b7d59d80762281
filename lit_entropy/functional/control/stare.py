"""STARE: surprisal-guided token-level advantage reweighting, gated by the batch entropy (arXiv 2606.19236).

Source: the authors' code, GitHub hp-luo/STARE, ``verl/trainer/ppo/core_algos.py`` (``STAREController``,
``compute_stare_token_weights``, ``compute_policy_loss_stare``). Restated:

- **Selection.** Among the valid tokens with ``A > 0`` (``T+``), the top ``P`` share by surprisal ``-log p``
  forms ``L+``; variant ``C2`` also takes the top ``P`` of the ``A < 0`` tokens as ``L-``. A set of ``n``
  candidates selects ``min(max(1, int(n P + 0.999999)), n)`` tokens (their rounding: a ceiling that forgives
  floating-point noise under 1e-6), none when ``n = 0`` or ``P = 0``.
- **Weights.** ``w = W`` on ``L+``, ``w = M`` on ``L-`` (C2), else 1; each token's clipped-surrogate loss is
  multiplied by ``w`` while the token-mean denominator is unchanged. For ``w > 0`` that is exactly the
  surrogate with advantage ``w A`` (both the ratio clip and the dual clip are positively homogeneous in A), which
  is how lit_entropy applies it: the weights multiply the advantages.
- **Gate and schedule** (their Sections 4.3 / 4.4). Once per step, before the loss, with the batch's token-mean
  entropy ``H``: ``gate_on = H < target``; when adaptive, ``W <- clip(W + alpha sgn(target - H), [1, w_max])``
  and ``M <- clip(M - alpha sgn(target - H), [m_min, 1])``. A non-finite ``H`` leaves everything unchanged.
  With the gate off every weight is 1 (GRPO).
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_flag, check_number
from lit_entropy.functional.selection import TopKCut, top_k_cut, top_k_mask

__all__ = ["StareState", "check_stare_args", "stare_controller_step", "stare_selection_count", "stare_weights"]

STARE_VARIANTS = ("O1", "C2")


class StareState(NamedTuple):
    """The controller's state after a step: the gate and the (possibly adapted) weights."""

    gate_on: bool
    reweight_w: float
    reweight_m: float


def check_stare_args(
    top_ratio: float,
    reweight_w: float,
    reweight_m: float,
    target_entropy: float,
    variant: str,
    adaptive: bool = False,
    alpha: float = 0.01,
    w_max: float = 1.5,
    m_min: float = 0.5,
) -> None:
    """Raise a ValueError naming the first bad STARE argument, its value and what is allowed."""
    check_number("top_ratio", top_ratio, low=0, high=1)
    check_number("reweight_w", reweight_w, low=0, low_open=True)
    check_number("reweight_m", reweight_m, low=0, low_open=True)
    check_number("target_entropy", target_entropy, low=0)
    check_choice("variant", variant, STARE_VARIANTS)
    check_flag("adaptive", adaptive)
    check_number("alpha", alpha, low=0)
    check_number("w_max", w_max, low=1)
    check_number("m_min", m_min, low=0, high=1, low_open=True)


def stare_selection_count(num_candidates: int, top_ratio: float) -> int:
    """Tokens STARE selects among ``num_candidates``: ``min(max(1, int(n P + 0.999999)), n)``, 0 if none or P = 0."""
    if num_candidates <= 0 or top_ratio <= 0.0:
        return 0
    return min(max(1, int(num_candidates * top_ratio + 0.999999)), num_candidates)


def stare_controller_step(
    state: StareState,
    batch_entropy: float,
    *,
    target_entropy: float,
    adaptive: bool = False,
    alpha: float = 0.01,
    w_max: float = 1.5,
    m_min: float = 0.5,
) -> StareState:
    """One controller update from the batch's token-mean entropy (nats); a non-finite entropy changes nothing."""
    batch_entropy = float(batch_entropy)
    if not math.isfinite(batch_entropy):
        return state
    gate_on = batch_entropy < target_entropy
    w, m = state.reweight_w, state.reweight_m
    if adaptive and alpha != 0.0:
        sign = float(target_entropy > batch_entropy) - float(target_entropy < batch_entropy)
        w = min(max(w + alpha * sign, 1.0), w_max)
        m = min(max(m - alpha * sign, m_min), 1.0)
    return StareState(gate_on, w, m)


def stare_weights(
    logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    *,
    top_ratio: float = 0.1,
    reweight_w: float = 1.1,
    reweight_m: float = 0.9,
    variant: Literal["O1", "C2"] = "O1",
    gate_on: bool = True,
    positive_cut: TopKCut | None = None,
    negative_cut: TopKCut | None = None,
) -> Tensor:
    """STARE's per-token weights ``[B, T]`` (1 outside the selected sets, and everywhere with the gate off).

    Args:
        logprobs: ``[B, T]`` log-probs of the sampled tokens (surprisal ``-log p`` ranks them).
        advantages: ``[B, T]``.
        mask: ``[B, T]`` bool, valid tokens.
        top_ratio: ``P``, the selected share of each advantage-sign set, in [0, 1].
        reweight_w: ``W``, the weight of ``L+``.
        reweight_m: ``M``, the weight of ``L-`` (variant C2 only).
        variant: ``"O1"`` (one-sided) or ``"C2"`` (both signs).
        gate_on: the controller's gate; False returns all ones.
        positive_cut, negative_cut: the global top-k cuts of the two sets over all shards; None selects within
            these tokens alone (the authors' per-micro-batch selection), ties by token index.

    Returns:
        float ``[B, T]`` weights, dtype of ``advantages``.
    """
    check_stare_args(top_ratio, reweight_w, reweight_m, 0.0, variant)
    weights = torch.ones_like(advantages)
    if not gate_on:
        return weights
    surprisal = -logprobs.detach()
    positive = mask & (advantages > 0)
    if positive_cut is None:
        positive_cut = top_k_cut(surprisal, positive, stare_selection_count(int(positive.sum()), top_ratio))
    weights = torch.where(top_k_mask(surprisal, positive, positive_cut), reweight_w, weights)
    if variant == "C2":
        negative = mask & (advantages < 0)
        if negative_cut is None:
            negative_cut = top_k_cut(surprisal, negative, stare_selection_count(int(negative.sum()), top_ratio))
        weights = torch.where(top_k_mask(surprisal, negative, negative_cut), reweight_m, weights)
    return weights

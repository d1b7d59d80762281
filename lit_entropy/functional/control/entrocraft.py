"""Entrocraft: keep the batch entropy inside a scheduled band by switching advantages (arXiv 2604.26326).

Source: the authors' code, GitHub lblaoke/entrocraft, ``verl/trainer/ppo/core_algos.py``
(``compute_grpo_range_outcome_advantage``, ``compute_grpo_range_linear_outcome_advantage``,
``compute_grpo_range_cos_outcome_advantage``, ``compute_raftpp_outcome_advantage``,
``compute_nsr_outcome_advantage``). Restated:

- **Band.** At training step ``s`` of ``S`` the bounds move from their first to their last value,
  linearly (``lo0 + (lo1 - lo0) s / S``) or on a half cosine (progress ``(1 - cos(pi s / S)) / 2``); the
  authors' reference run: lower 0.6 -> 0.4, upper 0.7 -> 0.5, linear. ``s`` counts from 1 (verl's
  ``global_steps``).
- **Switch.** With the batch's token-mean entropy ``H``: ``H > upper`` -> RAFT++ (only positive signals:
  ``max(r, 0)`` per sequence), ``H < lower`` -> NSR (only negative ones: ``min(r, 0)``), else GRPO.

The authors clamp the raw reward ``r`` (their verifier scores +1 / -1), so outside the band the advantage is
the unnormalised reward. ``signal="reward"`` reproduces that; with 0/1 rewards the NSR phase then has nothing
to push down, so ``signal="advantage"`` clamps the estimator's advantages instead (positive ones above the band,
negative ones below), the same switch for any reward scale.
"""

from __future__ import annotations

import math
from typing import Literal

from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number

__all__ = ["check_entrocraft_args", "entrocraft_advantages", "entrocraft_bounds", "entrocraft_phase"]

SCHEDULES = ("linear", "cos")
SIGNALS = ("reward", "advantage")
Phase = Literal["positive", "negative", "grpo"]


def check_entrocraft_args(
    lower_range: tuple[float, float], upper_range: tuple[float, float], schedule: str, signal: str
) -> None:
    """Raise a ValueError naming the first bad Entrocraft argument, its value and what is allowed."""
    for name, pair in (("lower_range", lower_range), ("upper_range", upper_range)):
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"{name} must be a pair (start, end) of entropies in nats, got {pair!r}")
        for index, value in enumerate(pair):
            check_number(f"{name}[{index}]", value, low=0)
    for start_or_end in (0, 1):
        if lower_range[start_or_end] > upper_range[start_or_end]:
            raise ValueError(
                f"lower_range must stay at or below upper_range, got lower_range={tuple(lower_range)} "
                f"and upper_range={tuple(upper_range)}"
            )
    check_choice("schedule", schedule, SCHEDULES)
    check_choice("signal", signal, SIGNALS)


def entrocraft_bounds(
    step: int,
    total_steps: int,
    *,
    lower_range: tuple[float, float] = (0.6, 0.4),
    upper_range: tuple[float, float] = (0.7, 0.5),
    schedule: Literal["linear", "cos"] = "linear",
) -> tuple[float, float]:
    """The band ``(lower, upper)`` in nats at training step ``step`` (from 1) of ``total_steps``."""
    check_number("total_steps", total_steps, low=1, integer=True)
    check_choice("schedule", schedule, SCHEDULES)
    progress = step / total_steps
    if schedule == "cos":
        progress = 0.5 * (1 - math.cos(math.pi * progress))
    lower = lower_range[0] + (lower_range[1] - lower_range[0]) * progress
    upper = upper_range[0] + (upper_range[1] - upper_range[0]) * progress
    return lower, upper


def entrocraft_phase(batch_entropy: float, lower: float, upper: float) -> Phase:
    """``"positive"`` above the band, ``"negative"`` below it, ``"grpo"`` inside (bounds included)."""
    if batch_entropy > upper:
        return "positive"
    if batch_entropy < lower:
        return "negative"
    return "grpo"


def entrocraft_advantages(
    advantages: Tensor,
    rewards: Tensor,
    mask: Tensor,
    phase: Phase,
    *,
    signal: Literal["reward", "advantage"] = "reward",
) -> Tensor:
    """The advantages ``[B, T]`` of ``phase``: the estimator's inside the band, clamped signals outside it.

    Args:
        advantages: ``[B, T]`` the estimator's (GRPO's) advantages, used inside the band (and by ``"advantage"``).
        rewards: ``[B]`` one reward per sequence (``"reward"``: clamped and broadcast over its tokens).
        mask: ``[B, T]`` bool, valid tokens.
        phase: from :func:`entrocraft_phase`.
        signal: clamp the raw reward (the authors') or the estimator's advantage.
    """
    check_choice("signal", signal, SIGNALS)
    if phase == "grpo":
        return advantages.masked_fill(~mask, 0.0)
    source = rewards.to(advantages.dtype).unsqueeze(-1).expand_as(advantages) if signal == "reward" else advantages
    clamped = source.clamp(min=0.0) if phase == "positive" else source.clamp(max=0.0)
    return clamped.masked_fill(~mask, 0.0)

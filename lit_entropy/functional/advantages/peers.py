"""The peers' newer estimators: Pass@k-GRPO (``grpo_passk``), OPO (``opo``), GDPO (``gdpo``) and ReMax (``remax``), as
verl 0.9.1 registers them.

- ``grpo_passk`` (arXiv 2503.19595; verl's ``compute_grpo_passk_outcome_advantage``): in each group only the
  best response learns, with advantage ``r_max - r_second``, divided by the group's std plus ``1e-6`` under
  ``model.advantages.scale: group`` (verl's ``norm_adv_by_std_in_grpo``), by the batch's under ``batch``, not at all
  under ``none``. Among tied best rewards the first in row order is "the best" (verl's ``torch.topk`` leaves ties
  unspecified; with a tie ``r_max - r_second = 0`` anyway).
- ``opo`` (On-Policy RL with optimal baseline, arXiv 2505.23585; verl's ``compute_opo_outcome_advantage``):
  ``A = r - b`` with the length-weighted baseline ``b = sum_i |y_i| r_i / sum_i |y_i|`` of the group (0 for a
  group of one; the plain mean for a group whose responses are all empty, where verl divides 0 by 0).
- ``gdpo`` (arXiv 2601.05242; verl's ``compute_gdpo_outcome_advantage``): each reward component is normalised
  within its group on its own (GRPO), the results summed with weights, and the sum whitened over the batch's
  valid tokens. The components come as ``reward_components`` ``[N, K]``; without them the reward itself is the
  one component (verl's fallback), i.e. GRPO's advantages whitened over the batch.
- ``remax`` (ReMax, arXiv 2310.10505; verl's ``compute_remax_outcome_advantage``): ``A = r - b`` with ``b`` the
  reward of the prompt's *greedy* completion, ``reward_baselines`` ``[N]`` (one per row, the same for a prompt's
  samples). No std scaling (``model.advantages.scale`` is not read). The training step generates and scores that
  greedy completion per prompt, as verl's trainer does, when the estimator is registered with
  ``needs_greedy_baseline=True``. The paper samples one completion per prompt; any group size works (each sample
  gets the same baseline).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.advantages.grpo import check_advantage_scale, grpo_advantages
from lit_entropy.functional.advantages.inputs import as_floating, check_token_shapes, on_valid_tokens
from lit_entropy.functional.advantages.whitening import whiten
from lit_entropy.functional.masked import as_bool_mask
from lit_entropy.functional.registry import register_advantage_estimator

__all__ = [
    "gdpo_estimator",
    "grpo_passk_advantages",
    "grpo_passk_estimator",
    "opo_advantages",
    "opo_estimator",
    "remax_advantages",
    "remax_estimator",
]


def _grouped(rewards: Tensor, group_size: int) -> Tensor:
    if not isinstance(group_size, int) or group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of group_size={group_size!r}")
    return as_floating(rewards).reshape(-1, group_size)


def grpo_passk_advantages(rewards: Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-6) -> Tensor:
    """``[N]``: ``r_max - r_second`` (scaled) on each group's first best response, 0 on the others."""
    check_advantage_scale(scale)
    if group_size < 2:
        raise ValueError(f"grpo_passk needs at least 2 samples per group, got group_size={group_size}")
    grouped = _grouped(rewards, group_size)
    top = grouped.topk(2, dim=-1).values
    gap = top[:, 0] - top[:, 1]
    if scale == "group":
        gap = gap / (grouped.std(dim=-1) + eps)
    elif scale == "batch":
        gap = gap / (grouped.std() + eps)
    best = grouped.argmax(dim=-1)  # the first maximum in row order
    out = torch.zeros_like(grouped)
    out[torch.arange(grouped.shape[0]), best] = gap
    return out.reshape(-1)


def opo_advantages(rewards: Tensor, lengths: Tensor, group_size: int) -> Tensor:
    """``[N]``: ``r - b`` with ``b`` the group's length-weighted mean reward (0 for a group of one)."""
    grouped = _grouped(rewards, group_size)
    weights = lengths.to(grouped.dtype).reshape(grouped.shape)
    total = weights.sum(dim=-1, keepdim=True)
    weighted = (weights * grouped).sum(dim=-1, keepdim=True) / total.clamp(min=1)
    baseline = torch.where(total > 0, weighted, grouped.mean(dim=-1, keepdim=True))
    if group_size == 1:
        baseline = torch.zeros_like(baseline)
    return (grouped - baseline).reshape(-1)


@register_advantage_estimator("grpo_passk", min_group_size=2)
def grpo_passk_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    scale: str = "group",
    **extra: Any,
) -> tuple[Tensor, None]:
    """The registered ``grpo_passk`` estimator (see the module docstring); ``scale`` from ``model.advantages.scale``;
    ``values`` not read (no critic)."""
    check_token_shapes(token_rewards, mask)
    mask = as_bool_mask(mask)
    return on_valid_tokens(grpo_passk_advantages(token_rewards.sum(dim=-1), group_size, scale=scale), mask), None


@register_advantage_estimator("opo", min_group_size=2)
def opo_estimator(
    token_rewards: Tensor, mask: Tensor, *, group_size: int, values: Tensor | None = None, **extra: Any
) -> tuple[Tensor, None]:
    """The registered ``opo`` estimator: length-weighted group baseline, no std scaling (see the module docstring);
    ``values`` not read (no critic)."""
    check_token_shapes(token_rewards, mask)
    mask = as_bool_mask(mask)
    return on_valid_tokens(opo_advantages(token_rewards.sum(dim=-1), mask.sum(dim=-1), group_size), mask), None


@register_advantage_estimator("gdpo", min_group_size=2)
def gdpo_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    scale: str = "group",
    reward_components: Tensor | None = None,
    reward_weights: Sequence[float] | None = None,
    **extra: Any,
) -> tuple[Tensor, None]:
    """The registered ``gdpo`` estimator: ``whiten(sum_k w_k GRPO(r_k))`` over the valid tokens.

    Args:
        token_rewards: ``[N, T]``; a row's reward is its sum (the one component when ``reward_components`` is None).
        mask: ``[N, T]`` bool.
        group_size: samples per prompt; rows are consecutive groups.
        values: not read (no critic).
        scale: each component's GRPO scale (``group``: verl's ``norm_adv_by_std_in_grpo``).
        reward_components: ``[N, K]`` the reward's named components, or None.
        reward_weights: ``K`` weights of the components (None: all 1).
    """
    check_token_shapes(token_rewards, mask)
    mask = as_bool_mask(mask)
    components = (
        token_rewards.sum(dim=-1, keepdim=True) if reward_components is None else as_floating(reward_components)
    )
    if components.dim() != 2 or components.shape[0] != mask.shape[0]:
        raise ValueError(f"reward_components must be [N, K] with N = {mask.shape[0]}, got {tuple(components.shape)}")
    weights = [1.0] * components.shape[1] if reward_weights is None else list(reward_weights)
    if len(weights) != components.shape[1]:
        raise ValueError(f"reward_weights has {len(weights)} weights for {components.shape[1]} reward components")
    total = sum(w * grpo_advantages(components[:, k], group_size, scale=scale) for k, w in enumerate(weights))
    return whiten(on_valid_tokens(torch.as_tensor(total), mask), mask), None


def remax_advantages(rewards: Tensor, baselines: Tensor) -> Tensor:
    """``[N]``: each sample's reward minus its prompt's greedy-completion reward (``baselines`` ``[N]``)."""
    if baselines.shape != rewards.shape:
        raise ValueError(
            f"reward_baselines must hold one greedy-completion reward per row, shape {tuple(rewards.shape)}, "
            f"got {tuple(baselines.shape)}"
        )
    return as_floating(rewards) - baselines.to(as_floating(rewards).dtype)


@register_advantage_estimator("remax", needs_greedy_baseline=True)
def remax_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    reward_baselines: Tensor | None = None,
    **extra: Any,
) -> tuple[Tensor, None]:
    """The registered ``remax`` estimator: ``r - b`` on every valid token, ``b`` the greedy completion's reward.

    Args:
        token_rewards: ``[N, T]``; a row's reward is its sum.
        mask: ``[N, T]`` bool.
        group_size: samples per prompt (not read: the baseline comes per row).
        values: not read (no critic).
        reward_baselines: ``[N]`` the reward of a greedy completion of each row's prompt.

    Raises:
        ValueError: ``reward_baselines`` is missing or not one per row.
    """
    check_token_shapes(token_rewards, mask)
    if reward_baselines is None:
        raise ValueError(
            "remax needs reward_baselines [N], the reward of a greedy completion of each row's prompt (the training "
            "step passes them for an estimator registered with needs_greedy_baseline=True)"
        )
    mask = as_bool_mask(mask)
    advantages = remax_advantages(token_rewards.sum(dim=-1), reward_baselines.to(token_rewards.device))
    return on_valid_tokens(advantages, mask), None

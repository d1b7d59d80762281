"""Critic-free advantage estimators of the REINFORCE family: RLOO, REINFORCE++ and REINFORCE++-baseline.

Registered in :data:`~lit_entropy.functional.registry.ADVANTAGE_ESTIMATORS` with the common signature
(``token_rewards [N, T]`` holding each sequence's reward at its last valid token, bool ``mask [N, T]``,
rows in consecutive groups of ``group_size``). None of them has a critic: they return ``(advantages, None)``
with advantages 0 at invalid positions.

The batch normalisation of the REINFORCE++ pair is over the rows given to the estimator (one rank's
rollout batch under data parallel, as in verl).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.advantages.inputs import as_floating, check_token_shapes, on_valid_tokens
from lit_entropy.functional.advantages.whitening import whiten
from lit_entropy.functional.checks import check_number
from lit_entropy.functional.masked import as_bool_mask
from lit_entropy.functional.registry import register_advantage_estimator

__all__ = [
    "discounted_returns",
    "reinforce_plus_plus_baseline_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
]


def _group_rewards(token_rewards: Tensor, mask: Tensor, group_size: Any, name: str) -> Tensor:
    """Each row's reward (its sum) as ``[num_prompts, group_size]``; refuses groups that cannot hold a baseline."""
    check_token_shapes(token_rewards, mask)
    if not isinstance(group_size, int) or isinstance(group_size, bool) or group_size < 2:
        raise ValueError(
            f"the {name!r} advantage estimator needs at least 2 samples per prompt (its baseline is built "
            f"from the other samples of the group): set model.sampling.num_samples >= 2, got {group_size!r}"
        )
    if token_rewards.shape[0] % group_size:
        raise ValueError(f"{token_rewards.shape[0]} rows are not whole groups of group_size {group_size}")
    return as_floating(token_rewards).sum(dim=-1).view(-1, group_size)


@register_advantage_estimator("rloo", min_group_size=2)
def rloo_estimator(
    token_rewards: Tensor, mask: Tensor, *, group_size: int, values: Tensor | None = None, **extra: Any
) -> tuple[Tensor, None]:
    """RLOO (Kool et al. 2019; Ahmadian et al. 2024): ``A_i = r_i - mean_{j != i} r_j`` within the group.

    Equivalently ``G / (G - 1) (r_i - mean_g)``; no std scaling (``scale`` is not read). An all-equal
    group gets 0; a group of 2 gets ``+-(r_1 - r_2)``.

    Args:
        token_rewards: ``[N, T]``; a row's reward is its sum.
        mask: ``[N, T]`` bool.
        group_size: samples per prompt, ``>= 2`` (``model.sampling.num_samples``).
        values, extra: not read.

    Raises:
        ValueError: ``group_size < 2`` (there is no other sample to leave out).
    """
    grouped = _group_rewards(token_rewards, mask, group_size, "rloo")
    others = (grouped.sum(dim=1, keepdim=True) - grouped) / (group_size - 1)
    advantages = grouped - others
    # All-equal groups give exactly 0, not the rounding of sum - r.
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    advantages = torch.where(constant, torch.zeros_like(advantages), advantages)
    return on_valid_tokens(advantages.reshape(-1), as_bool_mask(mask)), None


def discounted_returns(rewards: Tensor, mask: Tensor, gamma: float = 1.0) -> Tensor:
    """``G_t = sum_{s >= t, valid} gamma^(k(s) - k(t)) r_s`` over the valid tokens, ``k`` counting valid tokens.

    Invalid positions are skipped (their reward is not read) and get 0.

    Args:
        rewards: ``[N, T]`` token rewards.
        mask: ``[N, T]`` bool.
        gamma: discount in ``[0, 1]``.
    """
    check_number("gamma", gamma, low=0.0, high=1.0)
    mask = as_bool_mask(mask)
    r = as_floating(rewards)
    zero = torch.zeros((), dtype=r.dtype, device=r.device)
    out = torch.zeros_like(r)
    running = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        running = torch.where(mask[:, t], r[:, t] + gamma * running, running)
        out[:, t] = torch.where(mask[:, t], running, zero)
    return out


@register_advantage_estimator("reinforce_plus_plus")
def reinforce_plus_plus_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    gamma: float = 1.0,
    kl: Tensor | None = None,
    kl_coef: float = 0.0,
    **extra: Any,
) -> tuple[Tensor, None]:
    """REINFORCE++ (Hu 2025): batch-whitened discounted returns of the reward with the KL in it.

    Token reward ``r_t = R 1[t = last] - kl_coef * kl_t``; return ``G_t`` by :func:`discounted_returns`;
    advantages :func:`~lit_entropy.functional.whiten` of ``G`` over every valid token of the batch.
    Groups play no part (``group_size`` is not read; 1 is fine).

    The KL term is read only when the caller passes ``kl`` (``[N, T]``, e.g. ``log pi_old - log pi_ref``
    per token) and ``kl_coef``. The training step does not pass them (the settings have no KL-in-reward
    key yet), so there the reward carries no KL and a KL is added as a loss term by
    ``model.loss.kl_coef`` instead, as verl's ``use_kl_loss``.

    Args:
        token_rewards: ``[N, T]``.
        mask: ``[N, T]`` bool.
        group_size, values: not read.
        gamma: discount in ``[0, 1]`` (the paper: 1).
        kl: optional ``[N, T]`` per-token KL estimate (detached).
        kl_coef: ``>= 0``, the KL's weight in the reward.
    """
    check_token_shapes(token_rewards, mask)
    check_number("kl_coef", kl_coef, low=0.0)
    mask = as_bool_mask(mask)
    rewards = torch.where(mask, as_floating(token_rewards), torch.zeros((), device=mask.device))
    if kl is not None:
        if kl.shape != mask.shape:
            raise ValueError(f"kl {tuple(kl.shape)} must have the rewards' shape {tuple(mask.shape)}")
        kl = torch.where(mask, kl.detach().to(rewards.dtype), torch.zeros((), device=mask.device))
        rewards = rewards - kl_coef * kl
    return whiten(discounted_returns(rewards, mask, gamma), mask), None


@register_advantage_estimator("reinforce_plus_plus_baseline", min_group_size=2)
def reinforce_plus_plus_baseline_estimator(
    token_rewards: Tensor, mask: Tensor, *, group_size: int, values: Tensor | None = None, **extra: Any
) -> tuple[Tensor, None]:
    """REINFORCE++-baseline: ``R_i - mean_g R`` on each valid token, then whitened over the batch's valid tokens.

    The group mean removes the prompt's difficulty, the batch whitening (token-weighted, as verl's
    ``masked_whiten``) sets the scale; so an all-equal group is 0 only before the whitening. A group of 1
    has nothing to compare with and is refused (verl keeps its raw reward instead).

    Args:
        token_rewards: ``[N, T]``; a row's reward is its sum.
        mask: ``[N, T]`` bool.
        group_size: samples per prompt, ``>= 2``.
        values, extra: not read.
    """
    grouped = _group_rewards(token_rewards, mask, group_size, "reinforce_plus_plus_baseline")
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    centred = torch.where(constant, torch.zeros_like(centred), centred)
    mask = as_bool_mask(mask)
    return whiten(on_valid_tokens(centred.reshape(-1), mask), mask), None

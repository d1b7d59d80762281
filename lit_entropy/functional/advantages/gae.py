"""Generalised advantage estimation (PPO, with a critic), registered as the ``gae`` estimator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.advantages.inputs import as_floating, check_token_shapes
from lit_entropy.functional.advantages.whitening import whiten
from lit_entropy.functional.checks import check_number
from lit_entropy.functional.masked import as_bool_mask
from lit_entropy.functional.registry import register_advantage_estimator

__all__ = ["check_gae_args", "gae_advantages", "gae_estimator"]


def check_gae_args(*, gamma: float, lam: float, prefix: str = "") -> None:
    """Validate :func:`gae_advantages`' discount and lambda (each in ``[0, 1]``); ``prefix`` names settings."""
    check_number(f"{prefix}gamma", gamma, low=0.0, high=1.0)
    check_number(f"{prefix}lam", lam, low=0.0, high=1.0)


def gae_advantages(
    rewards: Tensor, values: Tensor, mask: Tensor, *, gamma: float = 1.0, lam: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over the valid tokens of each response.

    Backward recursion ``delta_t = r_t + gamma V_{t+1} - V_t``, ``A_t = delta_t + gamma lam A_{t+1}``,
    where ``t+1`` is the next *valid* token and the value after the last valid token is 0.
    Invalid positions are skipped (as verl does), which for right-padded responses is the
    textbook recursion. No whitening here: call :func:`whiten` on the advantages if wanted.

    Args:
        rewards: token-level rewards ``[B, T]`` (typically the sequence reward at the last valid token).
        values: critic values ``[B, T]`` (detached inside).
        mask: ``[B, T]`` bool.
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].

    Returns:
        ``(advantages, returns)``, each ``[B, T]``; ``returns = advantages + values``; both 0 at invalid positions.
    """
    if rewards.shape != values.shape or rewards.shape != mask.shape or rewards.dim() != 2:
        raise ValueError(
            f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and mask {tuple(mask.shape)} "
            "must share one [B, T] shape"
        )
    check_gae_args(gamma=gamma, lam=lam)
    mask = as_bool_mask(mask)
    dtype = torch.promote_types(as_floating(rewards).dtype, as_floating(values).dtype)
    zero = torch.zeros((), dtype=dtype, device=rewards.device)
    r = torch.where(mask, rewards.detach().to(dtype), zero)
    v = torch.where(mask, values.detach().to(dtype), zero)
    adv = torch.zeros_like(r)
    next_value = torch.zeros_like(r[:, 0])
    next_adv = torch.zeros_like(r[:, 0])
    for t in range(r.shape[1] - 1, -1, -1):
        valid = mask[:, t]
        delta = r[:, t] + gamma * next_value - v[:, t]
        here = delta + gamma * lam * next_adv
        # An invalid position carries the recursion state through unchanged.
        next_value = torch.where(valid, v[:, t], next_value)
        next_adv = torch.where(valid, here, next_adv)
        adv[:, t] = torch.where(valid, here, zero)
    returns = torch.where(mask, adv + v, zero)
    return adv, returns


@register_advantage_estimator("gae", needs_values=True)
def gae_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten_advantages: bool = True,
    **extra: Any,
) -> tuple[Tensor, Tensor]:
    """The registered ``gae`` estimator (PPO): :func:`gae_advantages`, whitened over the batch if asked.

    Args:
        token_rewards: ``[N, T]`` token-level rewards.
        mask: ``[N, T]`` bool.
        group_size: not read (GAE does not group).
        values: critic values ``[N, T]`` (required).
        gamma: discount in [0, 1].
        lam: GAE lambda in [0, 1].
        whiten_advantages: :func:`whiten` the advantages over the valid tokens of the batch.
        extra: other advantage options, not read.

    Returns:
        ``(advantages, returns)``, each ``[N, T]``; returns are the un-whitened advantages plus values.
    """
    if values is None:
        raise ValueError("the gae advantage estimator needs the critic's values (model.algorithm: ppo)")
    check_token_shapes(token_rewards, mask, values)
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages, returns

"""Advantage estimators: group-relative (GRPO / Dr.GRPO) and GAE (PPO), plus masked whitening.

``grpo`` and ``gae`` are registered in :data:`~lit_entropy.functional.registry.ADVANTAGE_ESTIMATORS`
(:func:`grpo_estimator`, :func:`gae_estimator`) with the registry's common signature.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.masked import as_bool_mask, masked_mean
from lit_entropy.functional.registry import register_advantage_estimator

__all__ = [
    "ADVANTAGE_SCALES",
    "check_advantage_scale",
    "check_gae_args",
    "gae_advantages",
    "gae_estimator",
    "grpo_advantages",
    "grpo_estimator",
    "whiten",
]

ADVANTAGE_SCALES: tuple[str, ...] = ("group", "batch", "none")
"""How :func:`grpo_advantages` divides the centred rewards: group std (GRPO), batch std, or not (Dr.GRPO)."""


def check_advantage_scale(scale: str, name: str = "scale") -> str:
    """Validate a :func:`grpo_advantages` scale against :data:`ADVANTAGE_SCALES`; ``name`` names the setting."""
    return check_choice(name, scale, ADVANTAGE_SCALES)


def check_gae_args(*, gamma: float, lam: float, prefix: str = "") -> None:
    """Validate :func:`gae_advantages`' discount and lambda (each in ``[0, 1]``); ``prefix`` names settings."""
    check_number(f"{prefix}gamma", gamma, low=0.0, high=1.0)
    check_number(f"{prefix}lam", lam, low=0.0, high=1.0)


def _float(values: Tensor) -> Tensor:
    """Floating copy view: integers/bools go to float32, low-precision floats to float32."""
    if values.dtype in (torch.float32, torch.float64):
        return values
    return values.to(torch.float32)


def grpo_advantages(rewards: Tensor, group_size: int, *, scale: str = "group", eps: float = 1e-6) -> Tensor:
    """Group-relative advantages, one per completion.

    ``rewards`` holds ``num_prompts * group_size`` scalars laid out as consecutive groups (the
    ``group_size`` samples of prompt 0, then prompt 1, ...). With ``mean_g`` the group mean:

    - ``"group"`` (GRPO): ``(r - mean_g) / (std_g + eps)``, ``std_g`` unbiased (``torch.std``, as TRL/verl);
    - ``"batch"``: ``(r - mean_g) / (std_batch + eps)``, unbiased std over all rewards;
    - ``"none"`` (Dr.GRPO): ``r - mean_g``.

    A group whose rewards are all equal gets exactly 0 (never NaN; a group of size 1 too).

    Args:
        rewards: ``[num_prompts * group_size]`` scalar rewards.
        group_size: samples per prompt (>= 1).
        scale: ``"group"``, ``"batch"`` or ``"none"``.
        eps: added to the std in the denominator.

    Returns:
        Advantages of ``rewards``' shape, float32 (float64 if ``rewards`` is float64).
    """
    check_advantage_scale(scale)
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"group_size must be an int >= 1, got {group_size!r}")
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [num_prompts * group_size], got shape {tuple(rewards.shape)}")
    if rewards.numel() % group_size:
        raise ValueError(f"rewards length {rewards.numel()} is not divisible by group_size {group_size}")
    r = _float(rewards)
    grouped = r.view(-1, group_size)
    centred = grouped - grouped.mean(dim=1, keepdim=True)
    # Equal rewards give exactly 0: the mean's rounding must not leak through a tiny denominator.
    constant = grouped.amax(dim=1, keepdim=True) == grouped.amin(dim=1, keepdim=True)
    if scale == "group":
        std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(centred[:, :1])
        adv = centred / (std + eps)
    elif scale == "batch":
        std = r.std() if r.numel() > 1 else torch.zeros((), dtype=r.dtype, device=r.device)
        adv = centred / (std + eps)
    else:
        adv = centred
    adv = torch.where(constant, torch.zeros_like(adv), adv)
    return adv.reshape(rewards.shape)


def whiten(values: Tensor, mask: Tensor, shift_mean: bool = True, *, eps: float = 1e-8) -> Tensor:
    """Masked whitening as verl's ``masked_whiten``: ``(x - mean) / sqrt(var + eps)`` over valid entries.

    ``var`` is the unbiased (Bessel-corrected) variance of the valid entries; with fewer than two
    valid entries it is taken as 0. With ``shift_mean=False`` the mean is added back (scale only).
    Invalid positions are returned as 0.

    Args:
        values: ``[B, T]``.
        mask: ``[B, T]`` bool.
        shift_mean: centre the result (True) or keep the original mean.
        eps: added to the variance.
    """
    if values.shape != mask.shape:
        raise ValueError(f"mask shape {tuple(mask.shape)} does not match values shape {tuple(values.shape)}")
    mask = as_bool_mask(mask)
    x = _float(values)
    mean = masked_mean(x, mask)
    count = mask.sum()
    var = masked_mean((x - mean).square(), mask)
    var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.zeros_like(var))
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros_like(out))


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
    dtype = torch.promote_types(_float(rewards).dtype, _float(values).dtype)
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


def _check_token_shapes(token_rewards: Tensor, mask: Tensor, values: Tensor | None = None) -> None:
    shapes = [token_rewards.shape, mask.shape] + ([] if values is None else [values.shape])
    if token_rewards.dim() != 2 or any(shape != token_rewards.shape for shape in shapes):
        detail = f"token_rewards {tuple(token_rewards.shape)}, mask {tuple(mask.shape)}"
        detail += "" if values is None else f", values {tuple(values.shape)}"
        raise ValueError(f"{detail} must share one [N, T] shape")


@register_advantage_estimator("grpo", min_group_size=2)
def grpo_estimator(
    token_rewards: Tensor,
    mask: Tensor,
    *,
    group_size: int,
    values: Tensor | None = None,
    scale: str = "group",
    **extra: Any,
) -> tuple[Tensor, None]:
    """The registered ``grpo`` estimator: :func:`grpo_advantages` of each row's reward on its valid tokens.

    Args:
        token_rewards: ``[N, T]``; a row's reward is its sum (the outcome reward sits at its last valid token).
        mask: ``[N, T]`` bool.
        group_size: samples per prompt; rows are consecutive groups.
        values: not read (GRPO has no critic).
        scale: ``group``, ``batch`` or ``none``, see :func:`grpo_advantages`.
        extra: other advantage options, not read.

    Returns:
        ``(advantages, None)``: the sequence's advantage on each valid token, 0 at invalid positions.
    """
    _check_token_shapes(token_rewards, mask)
    mask = as_bool_mask(mask)
    per_sequence = grpo_advantages(token_rewards.sum(dim=-1), group_size, scale=scale)
    advantages = torch.where(mask, per_sequence.unsqueeze(-1), per_sequence.new_zeros(()))
    return advantages, None


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
    _check_token_shapes(token_rewards, mask, values)
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=gamma, lam=lam)
    if whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages, returns

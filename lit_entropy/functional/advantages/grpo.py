"""Group-relative advantages (GRPO / Dr.GRPO), registered as the ``grpo`` estimator."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.advantages.inputs import as_floating, check_token_shapes, on_valid_tokens
from lit_entropy.functional.checks import check_choice
from lit_entropy.functional.masked import as_bool_mask
from lit_entropy.functional.registry import register_advantage_estimator

__all__ = ["ADVANTAGE_SCALES", "check_advantage_scale", "grpo_advantages", "grpo_estimator"]

ADVANTAGE_SCALES: tuple[str, ...] = ("group", "batch", "none")
"""How :func:`grpo_advantages` divides the centred rewards: group std (GRPO), batch std, or not (Dr.GRPO)."""


def check_advantage_scale(scale: str, name: str = "scale") -> str:
    """Validate a :func:`grpo_advantages` scale against :data:`ADVANTAGE_SCALES`; ``name`` names the setting."""
    return check_choice(name, scale, ADVANTAGE_SCALES)


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
    r = as_floating(rewards)
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
    check_token_shapes(token_rewards, mask)
    mask = as_bool_mask(mask)
    per_sequence = grpo_advantages(token_rewards.sum(dim=-1), group_size, scale=scale)
    return on_valid_tokens(per_sequence, mask), None

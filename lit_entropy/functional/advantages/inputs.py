"""What the registered advantage estimators share: the check of their ``[N, T]`` inputs, the floating dtype
they compute in, and per-sequence advantages spread onto each valid token."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["as_floating", "check_token_shapes", "on_valid_tokens"]


def as_floating(values: Tensor) -> Tensor:
    """Floating copy view: integers/bools go to float32, low-precision floats to float32."""
    if values.dtype in (torch.float32, torch.float64):
        return values
    return values.to(torch.float32)


def check_token_shapes(token_rewards: Tensor, mask: Tensor, values: Tensor | None = None) -> None:
    """Refuse ``token_rewards``, ``mask`` (and ``values``) that do not share one ``[N, T]`` shape."""
    shapes = [token_rewards.shape, mask.shape] + ([] if values is None else [values.shape])
    if token_rewards.dim() != 2 or any(shape != token_rewards.shape for shape in shapes):
        detail = f"token_rewards {tuple(token_rewards.shape)}, mask {tuple(mask.shape)}"
        detail += "" if values is None else f", values {tuple(values.shape)}"
        raise ValueError(f"{detail} must share one [N, T] shape")


def on_valid_tokens(per_sequence: Tensor, mask: Tensor) -> Tensor:
    """``[N]`` per-sequence values on each valid token of ``[N, T]`` (bool ``mask``), 0 elsewhere."""
    return torch.where(mask, per_sequence.unsqueeze(-1), per_sequence.new_zeros(()))

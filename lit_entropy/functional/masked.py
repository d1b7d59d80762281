"""Masked reductions over per-token tensors.

Every per-token tensor in lit_entropy has shape ``[batch, response_len]`` with a boolean
``mask`` of the same shape (True = a real response token).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["as_bool_mask", "compute_dtype", "masked_mean", "masked_moments", "masked_sum"]


def as_bool_mask(mask: Tensor) -> Tensor:
    """``mask`` as bool (non-zero = True); a bool mask is returned as is."""
    return mask if mask.dtype == torch.bool else mask != 0


def compute_dtype(*tensors: Tensor) -> torch.dtype:
    """float64 if any input is float64, else float32: bf16/fp16 lose the small deviations RL losses and
    statistics care about (importance ratios near 1, centred discriminators)."""
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of ``values`` where ``mask`` is True (over ``dim``, or everything when None)."""
    zeros = torch.zeros((), dtype=values.dtype, device=values.device)
    picked = torch.where(mask, values, zeros)
    return picked.sum() if dim is None else picked.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean of ``values`` where ``mask`` is True; 0 where nothing is selected (never NaN)."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(values, mask, dim) / count.clamp(min=1).to(values.dtype)


def masked_moments(values: Tensor, mask: Tensor) -> Tensor:
    """Count, sum and sum of squares of the selected values, in float64.

    The three moments add up across shards, so a ``SUM`` all-reduce of this tensor gives the
    moments of the global batch (used for distributed Clip_B / Clip_V statistics).

    Returns:
        Tensor of shape ``[3]``: ``(count, sum, sum of squares)``.
    """
    selected = values.detach().to(torch.float64)[mask]
    return torch.stack(
        [
            torch.tensor(float(selected.numel()), dtype=torch.float64, device=values.device),
            selected.sum(),
            selected.square().sum(),
        ]
    )

"""Shared pieces of lit_entropy's metrics: step values for Lightning and float64 accumulators (their
torchmetrics hooks live in :mod:`lit_entropy.internals.torchmetrics`), token-mask checks."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.internals.torchmetrics import Float64StateMetric, StepValueMetric

__all__ = ["Float64StateMetric", "StepValueMetric", "token_mask"]


def token_mask(mask: Tensor | None, values: Tensor, name: str) -> Tensor:
    """The bool ``[B, T]`` mask of ``values`` (all True when None); ValueError on a wrong dtype or shape."""
    if mask is None:
        return torch.ones_like(values, dtype=torch.bool)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"`mask` must be a bool tensor, got {got}")
    if mask.shape != values.shape:
        raise ValueError(f"`mask` shape {tuple(mask.shape)} != `{name}` shape {tuple(values.shape)}")
    return mask

"""Masked whitening of per-token values (verl's ``masked_whiten``), used by GAE and the REINFORCE++ pair."""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.functional.advantages.inputs import as_floating
from lit_entropy.functional.masked import as_bool_mask, masked_mean

__all__ = ["whiten"]


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
    x = as_floating(values)
    mean = masked_mean(x, mask)
    count = mask.sum()
    var = masked_mean((x - mean).square(), mask)
    var = torch.where(count > 1, var * count / (count - 1).clamp(min=1), torch.zeros_like(var))
    out = (x - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return torch.where(mask, out, torch.zeros_like(out))

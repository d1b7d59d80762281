"""Numerics and argument checks shared by the entropy kernels over logits (:mod:`.logits`) and over hidden states
and the LM head (:mod:`.linear`, :mod:`.linear_loss`): the floor of the shifted logits, the temperature and the
token ids."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["X_FLOOR", "check_temperature", "check_token_ids"]

# Floor for the shifted logits x = (z - max z) / T <= 0, per compute dtype. exp(x)^2 must stay a
# *normal* float: denormal results make exp/mul ~80x slower on x86 (measured), which happens for
# ordinary LLM logits (x < -44 in float32). Entries below the floor have p < 4e-18 (float32), so the
# clamp changes H by < V * 2e-16 (3e-11 at V = 151936). It also maps masked (-inf) logits to a
# finite value, keeping 0 * (-inf) = NaN out of sum p log p.
X_FLOOR = {torch.float32: -40.0, torch.float64: -300.0}


def check_temperature(temperature: float) -> float:
    """The sampling temperature as a float; refuses one that is not a finite number > 0."""
    t = float(temperature)
    if not (math.isfinite(t) and t > 0.0):
        raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
    return t


def check_token_ids(token_ids: Tensor, shape: tuple[int, ...], vocab: int, source: str = "logits") -> None:
    """Integer ids of ``shape`` in ``[0, vocab)``; ``source`` names the tensor ``shape`` comes from (messages)."""
    if not isinstance(token_ids, Tensor):
        raise ValueError(f"token_ids must be a torch.Tensor, got {type(token_ids).__name__}")
    if token_ids.is_floating_point() or token_ids.is_complex() or token_ids.dtype == torch.bool:
        raise ValueError(f"token_ids must be an integer tensor, got dtype={token_ids.dtype}")
    if tuple(token_ids.shape) != tuple(shape):
        got = tuple(token_ids.shape)
        raise ValueError(f"token_ids shape must equal {source}.shape[:-1]={tuple(shape)}, got token_ids.shape={got}")
    if token_ids.numel() > 0:
        lo, hi = int(token_ids.min()), int(token_ids.max())
        if lo < 0 or hi >= vocab:
            raise ValueError(f"token_ids must lie in [0, {vocab}), got values in [{lo}, {hi}]")

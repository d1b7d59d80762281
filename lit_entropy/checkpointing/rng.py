"""Every RNG state a rollout samples from (torch CPU/CUDA, numpy, Python), as checkpoint-safe plain data."""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch

__all__ = ["get_rng_state", "set_rng_state"]


def get_rng_state() -> dict[str, Any]:
    """This process's torch (CPU and current CUDA device), numpy and Python RNG states."""
    # Plain containers and tensors only, so ``torch.load(weights_only=True)`` accepts the checkpoint.
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)  # legacy: the tuple
    assert isinstance(keys, np.ndarray)
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [str(name), torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)],
        "python": random.getstate(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore a state from :func:`get_rng_state`."""
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])

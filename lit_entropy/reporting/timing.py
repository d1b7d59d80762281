"""Where a training step's time and memory go: ``perf/time_<phase>_s`` and ``perf/peak_memory_mb``."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["PhaseTimer", "peak_memory_mb"]


class PhaseTimer:
    """Wall-clock seconds of the named phases of one training step (``perf/time_<phase>_s``).

    CUDA work is asynchronous: on a GPU each phase ends with a synchronize so its time is its own.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """The phases timed since the last ``pop``, and reset."""
        out, self.seconds = self.seconds, {}
        return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: CUDA max allocated on a GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10

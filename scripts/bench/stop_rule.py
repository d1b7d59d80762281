"""A heavy-tailed stop rule for benchmarks: Hugging Face ``generate`` ends each row after a drawn number of tokens.

A randomly initialised model almost never samples EOS, so every completion would run to ``max_new_tokens``. For
``python -m scripts.bench.step --stop-rule`` every ``generate`` call (lit_entropy's HF engine and TRL's alike) gets a
:class:`StopRule` logits processor: row ``i`` ends with EOS after ``L_i`` tokens,

    L_i = clip(round(100 * exp(z_i)), 16, max_new_tokens),   z_i ~ N(0, 1),

a log-normal with median 100 tokens (mean ~165 before clipping, 5% of rows reach 512) -- the long right tail of
real RL responses, where a few rows run 5-30x longer than the median. Before its stop, a row may not end with EOS;
the draws of call ``k`` come from seed ``k``, so every side of a benchmark sees the same lengths at the same step.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["MEDIAN", "StopRule", "draw_lengths", "install_stop_rule", "static_batch_waste"]

MEDIAN, SIGMA, SHORTEST = 100, 1.0, 16


def draw_lengths(rows: int, max_new_tokens: int, seed: int) -> torch.Tensor:
    """``[rows]`` completion lengths of the stop rule (long), drawn with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, generator=gen, dtype=torch.float64)
    return (MEDIAN * torch.exp(SIGMA * z)).round().clamp(SHORTEST, max_new_tokens).long()


def static_batch_waste(lengths: torch.Tensor) -> float:
    """Share of a static batch's decode slots (rows x longest row) spent on rows that already ended."""
    return 1.0 - float(lengths.sum()) / (lengths.numel() * float(lengths.max()))


class StopRule:
    """A ``transformers`` logits processor forcing EOS at each row's drawn length (see the module docstring)."""

    def __init__(self, eos_token_id: int, max_new_tokens: int, seed: int) -> None:
        self.eos, self.max_new_tokens, self.seed = eos_token_id, max_new_tokens, seed
        self.start: int | None = None
        self.lengths: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.start is None:
            self.start = input_ids.shape[1]
            self.lengths = draw_lengths(input_ids.shape[0], self.max_new_tokens, self.seed).to(scores.device)
        made = input_ids.shape[1] - self.start  # tokens generated before this one
        last = self.lengths == made + 1
        scores[self.lengths > made + 1, self.eos] = -math.inf
        scores[last] = -math.inf
        scores[last, self.eos] = 0.0
        return scores


def install_stop_rule(eos_token_id: int, max_new_tokens: int) -> Callable[[], None]:
    """Add a fresh :class:`StopRule` to every ``GenerationMixin.generate`` call of this process; returns the undo."""
    from transformers import LogitsProcessorList
    from transformers.generation.utils import GenerationMixin

    original = GenerationMixin.generate
    calls = itertools.count()

    def generate(self: Any, *args: Any, **kwargs: Any) -> Any:
        processors = LogitsProcessorList(kwargs.pop("logits_processor", None) or [])
        processors.append(StopRule(eos_token_id, max_new_tokens, seed=next(calls)))
        return original(self, *args, logits_processor=processors, **kwargs)

    GenerationMixin.generate = generate

    def undo() -> None:
        GenerationMixin.generate = original

    return undo

"""Overlong handling: DAPO's soft overlong punishment and the truncated-row test (no EOS within the budget)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_number

__all__ = ["check_overlong_args", "overlong_penalty", "truncated_rows"]


def check_overlong_args(*, max_new_tokens: int, buffer: int, factor: float, prefix: str = "") -> None:
    """Refuse a buffer that is not an integer in ``[0, max_new_tokens)`` or a negative / non-finite factor.

    Args:
        max_new_tokens: the sampling length limit (``model.sampling.max_new_tokens``).
        buffer: tokens before the limit over which the penalty grows (0 = off).
        factor: the penalty at the limit, as a positive magnitude.
        prefix: dotted prefix of the setting names in messages (``"model.reward."``).
    """
    check_number(f"{prefix}overlong_buffer", buffer, low=0, integer=True)
    check_number(f"{prefix}overlong_penalty_factor", factor, low=0)
    if buffer >= max_new_tokens:
        raise ValueError(
            f"{prefix}overlong_buffer must be < model.sampling.max_new_tokens={max_new_tokens} "
            f"(the penalty starts at max_new_tokens - buffer tokens), got {buffer!r}"
        )


def overlong_penalty(lengths: Tensor, *, max_new_tokens: int, buffer: int, factor: float) -> Tensor:
    """DAPO's soft overlong punishment, ``min((max_new_tokens - buffer) - L, 0) / buffer * factor`` per row.

    0 up to ``max_new_tokens - buffer`` tokens, then linearly down to ``-factor`` at ``max_new_tokens``
    (as verl's ``overlong_buffer``). Added to the reward that feeds advantages, never to correctness.

    Args:
        lengths: ``[N]`` response lengths in tokens (valid tokens, EOS included).
        max_new_tokens: the sampling length limit ``M``.
        buffer: ``B`` in ``[0, M)``; 0 = off (all zeros).
        factor: the penalty magnitude at ``L = M``.

    Returns:
        ``[N]`` float32 penalties (<= 0).
    """
    lengths = lengths.to(torch.float32)
    if buffer == 0:
        return torch.zeros_like(lengths)
    return ((max_new_tokens - buffer) - lengths).clamp(max=0.0) / buffer * factor


def truncated_rows(responses: Tensor, mask: Tensor, *, max_new_tokens: int, eos_token_ids: Sequence[int]) -> Tensor:
    """Rows that reached ``max_new_tokens`` without ending in an EOS: ``[N]`` bool.

    Args:
        responses: ``[N, T]`` generated ids.
        mask: ``[N, T]`` bool response mask (True up to and including the first EOS).
        max_new_tokens: the sampling length limit.
        eos_token_ids: ids that end a completion (empty: only the length decides).
    """
    lengths = mask.sum(-1)
    rows = torch.arange(mask.shape[0], device=mask.device)
    last = responses[rows, (lengths - 1).clamp(min=0)]
    eos = torch.as_tensor(list(eos_token_ids), dtype=responses.dtype, device=mask.device).reshape(-1)
    return (lengths >= max_new_tokens) & ~torch.isin(last, eos)

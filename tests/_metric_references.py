"""Plain-Python references of lit_entropy's metrics (loops over lists, no tensor math), shared by the metric tests."""

from __future__ import annotations

import math

import torch


def ref_token_entropy(batches: list[tuple[torch.Tensor, torch.Tensor]]) -> float:
    """Mean of the values under True mask entries of ``(values, mask)`` batches; NaN when there is none."""
    total, count = 0.0, 0
    for values, mask in batches:
        for value_row, mask_row in zip(values.tolist(), mask.tolist(), strict=True):
            for value, keep in zip(value_row, mask_row, strict=True):
                if keep:
                    total += value
                    count += 1
    return total / count if count else math.nan


def ref_clip(
    batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]], eps_low: float, eps_high: float
) -> dict[str, float]:
    """Low / high / total clipped fractions of ``(ratio, advantages, mask)`` batches (TRL's counting)."""
    low = high = count = 0
    for ratio, advantages, mask in batches:
        for b, (ratio_row, mask_row) in enumerate(zip(ratio.tolist(), mask.tolist(), strict=True)):
            for t, (r, keep) in enumerate(zip(ratio_row, mask_row, strict=True)):
                if not keep:
                    continue
                a = advantages[b].item() if advantages.ndim == 1 else advantages[b, t].item()
                count += 1
                if r < 1 - eps_low and a < 0:
                    low += 1
                if r > 1 + eps_high and a > 0:
                    high += 1
    return {"low": low / count, "high": high / count, "total": (low + high) / count}


def prompt_rows(batches: list[torch.Tensor]) -> list[list[bool]]:
    """The rows (one prompt's samples each) of ``[P, n]`` correctness batches, as lists."""
    return [row for batch in batches for row in batch.tolist()]


def ref_avg(rows: list[list[bool]]) -> float:
    return sum(sum(row) / len(row) for row in rows) / len(rows)


def ref_pass(rows: list[list[bool]], k: int) -> float:
    per_prompt = []
    for row in rows:
        n, c = len(row), sum(row)
        per_prompt.append(1 - math.comb(n - c, k) / math.comb(n, k))
    return sum(per_prompt) / len(per_prompt)

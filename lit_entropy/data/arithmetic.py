"""Synthetic integer-arithmetic prompts (``"23+45="`` -> ``"68"``) for the embedded tiny model.

The full problem set for given ``max_operand``/``operations`` is enumerated and partitioned into
train / validation / test with a *fixed* internal seed, so the splits are disjoint problem sets
whatever ``seed`` the caller passes; ``seed`` only chooses which problems of the split are drawn and in
what order. Asking for ``n`` examples returns the first ``n`` of the seed's ordering, so a smaller
request is a prefix of a larger one.
"""

from __future__ import annotations

import random

__all__ = [
    "ARITHMETIC_ALPHABET",
    "ARITHMETIC_OPERATIONS",
    "ARITHMETIC_SPLITS",
    "DEFAULT_MAX_OPERAND",
    "arithmetic_split_size",
    "make_arithmetic_examples",
    "solve_arithmetic",
]

#: Every character a prompt or an answer can contain (digits, operators, ``=``).
ARITHMETIC_ALPHABET = "0123456789+-*="
#: Supported binary operations.
ARITHMETIC_OPERATIONS = "+-*"
#: Split names; each is a disjoint part of the enumerated problem set.
ARITHMETIC_SPLITS = ("train", "validation", "test")
#: Default operand range ``0..DEFAULT_MAX_OPERAND``; sized so the embedded model, warm-started for a few
#: seconds, lands mid-way in accuracy (see ``scripts/assets/make_tiny_model.py``).
DEFAULT_MAX_OPERAND = 29

# Fraction of the enumerated problems held out for validation and for test (each).
_HELD_OUT_FRACTION = 0.1
# Fixed seed of the partition, independent of the caller's seed so splits never overlap.
_PARTITION_SEED = 20240917
_MAX_SUPPORTED_OPERAND = 99  # keeps answers <= 4 chars ("9801", "-99") and the pool enumerable


def solve_arithmetic(a: int, op: str, b: int) -> int:
    """Exact integer result of ``a op b`` for ``op`` in ``ARITHMETIC_OPERATIONS``."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"op must be one of {ARITHMETIC_OPERATIONS!r}, got {op!r}")


def _validate(split: str, max_operand: int, operations: str, seed: int) -> None:
    if split not in ARITHMETIC_SPLITS:
        raise ValueError(f"split must be one of {ARITHMETIC_SPLITS}, got {split!r}")
    if isinstance(max_operand, bool) or not isinstance(max_operand, int) or not 1 <= max_operand <= 99:
        raise ValueError(f"max_operand must be an int in [1, {_MAX_SUPPORTED_OPERAND}], got {max_operand!r}")
    if (
        not isinstance(operations, str)
        or not operations
        or any(op not in ARITHMETIC_OPERATIONS for op in operations)
        or len(set(operations)) != len(operations)
    ):
        raise ValueError(
            f"operations must be a non-empty string of distinct chars from "
            f"{ARITHMETIC_OPERATIONS!r}, got {operations!r}"
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ValueError(f"seed must be an int, got {seed!r}")


def _split_pool(split: str, max_operand: int, operations: str) -> list[tuple[int, str, int]]:
    """The split's problems ``(a, op, b)`` in a canonical (seed-independent) order."""
    # Canonical operation order so "+-" and "-+" describe the same problem set and partition.
    ops = [op for op in ARITHMETIC_OPERATIONS if op in operations]
    problems = [(a, op, b) for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)]
    random.Random(_PARTITION_SEED).shuffle(problems)
    n_held = max(1, round(_HELD_OUT_FRACTION * len(problems)))
    if split == "validation":
        return problems[:n_held]
    if split == "test":
        return problems[n_held : 2 * n_held]
    return problems[2 * n_held :]


def arithmetic_split_size(split: str, *, max_operand: int = DEFAULT_MAX_OPERAND, operations: str = "+-") -> int:
    """Number of distinct problems in ``split`` (the most ``make_arithmetic_examples`` can return)."""
    _validate(split, max_operand, operations, 0)
    return len(_split_pool(split, max_operand, operations))


def make_arithmetic_examples(
    split: str,
    num_examples: int,
    *,
    seed: int = 0,
    max_operand: int = DEFAULT_MAX_OPERAND,
    operations: str = "+-",
) -> list[dict[str, str]]:
    """Draw ``num_examples`` distinct problems of ``split``.

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"`` (disjoint problem sets).
        num_examples: How many problems, ``1 <= num_examples <= arithmetic_split_size(split, ...)``.
        seed: Chooses the problems and their order within the split (not the split itself).
        max_operand: Operands are the integers ``0..max_operand`` (at most 99).
        operations: Subset of ``"+-*"``; subtraction may give negative answers (``"3-7="`` -> ``"-4"``).

    Returns:
        List of ``{"prompt": "23+45=", "answer": "68"}`` dicts; answers are base-10 integers.
    """
    _validate(split, max_operand, operations, seed)
    pool = _split_pool(split, max_operand, operations)
    if isinstance(num_examples, bool) or not isinstance(num_examples, int) or not 1 <= num_examples <= len(pool):
        raise ValueError(f"num_examples must be an int in [1, {len(pool)}] for split {split!r}, got {num_examples!r}")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    out = []
    for i in order[:num_examples]:
        a, op, b = pool[i]
        out.append({"prompt": f"{a}{op}{b}=", "answer": str(solve_arithmetic(a, op, b))})
    return out

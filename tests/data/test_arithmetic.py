"""Synthetic arithmetic splits: disjoint, deterministic, correct answers, argument validation."""

from __future__ import annotations

import pytest

from lit_entropy.data.arithmetic import (
    ARITHMETIC_ALPHABET,
    arithmetic_split_size,
    make_arithmetic_examples,
)


def _parse(prompt: str) -> tuple[int, str, int]:
    """Split "a<op>b=" by hand (operands are non-negative, so the operator is the first non-digit)."""
    assert prompt.endswith("=")
    body = prompt[:-1]
    i = 0
    while body[i].isdigit():
        i += 1
    return int(body[:i]), body[i], int(body[i + 1 :])


def _reference(a: int, op: str, b: int) -> int:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    assert op == "*"
    total = 0
    for _ in range(b):  # multiplication by repeated addition, independent of the module
        total += a
    return total


def _all(split: str, **kw) -> list[dict[str, str]]:
    return make_arithmetic_examples(split, arithmetic_split_size(split, **kw), **kw)


@pytest.mark.parametrize("kw", [{}, {"max_operand": 12, "operations": "+-*"}, {"max_operand": 3, "operations": "-"}])
def test_splits_partition_the_full_problem_set(kw):
    max_operand = kw.get("max_operand", 29)
    ops = kw.get("operations", "+-")
    expected = {f"{a}{op}{b}=" for op in ops for a in range(max_operand + 1) for b in range(max_operand + 1)}
    sets = {s: [ex["prompt"] for ex in _all(s, **kw)] for s in ("train", "validation", "test")}
    for prompts in sets.values():
        assert len(prompts) == len(set(prompts)) > 0  # distinct within a split
    assert set(sets["train"]).isdisjoint(sets["validation"])
    assert set(sets["train"]).isdisjoint(sets["test"])
    assert set(sets["validation"]).isdisjoint(sets["test"])
    assert set().union(*map(set, sets.values())) == expected
    n = len(expected)
    assert len(sets["validation"]) == len(sets["test"]) == max(1, round(0.1 * n))


def test_splits_stay_disjoint_across_seeds():
    train = {ex["prompt"] for ex in make_arithmetic_examples("train", 500, seed=1)}
    val = {ex["prompt"] for ex in make_arithmetic_examples("validation", 100, seed=7)}
    assert train.isdisjoint(val)


def test_deterministic_and_prefix_stable():
    a = make_arithmetic_examples("train", 50, seed=3)
    assert a == make_arithmetic_examples("train", 50, seed=3)
    assert make_arithmetic_examples("train", 20, seed=3) == a[:20]
    assert a != make_arithmetic_examples("train", 50, seed=4)  # the seed changes the draw


@pytest.mark.parametrize("ops", ["+", "-", "*", "+-*"])
def test_answers_are_correct(ops):
    for ex in _all("validation", max_operand=15, operations=ops) + make_arithmetic_examples(
        "train", 200, max_operand=15, operations=ops
    ):
        a, op, b = _parse(ex["prompt"])
        assert op in ops and 0 <= a <= 15 and 0 <= b <= 15
        assert int(ex["answer"]) == _reference(a, op, b)
        assert ex["answer"] == str(int(ex["answer"]))  # canonical form, no "+" or leading zeros
        assert set(ex["prompt"] + ex["answer"]) <= set(ARITHMETIC_ALPHABET)


def test_default_task_is_short():
    exs = _all("train") + _all("validation") + _all("test")
    assert max(len(ex["answer"]) for ex in exs) <= 3
    assert max(len(ex["prompt"]) for ex in exs) <= 6
    # the largest answers exist: 29 + 29 and 0 - 29
    assert {"58", "-29"} <= {ex["answer"] for ex in exs}
    worst = _all("validation", max_operand=99, operations="*")
    assert max(len(ex["answer"]) for ex in worst) <= 4


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"split": "dev", "num_examples": 1}, "split"),
        ({"split": "train", "num_examples": 0}, "num_examples"),
        ({"split": "train", "num_examples": True}, "num_examples"),
        ({"split": "validation", "num_examples": 10_000}, "num_examples"),
        ({"split": "train", "num_examples": 1, "max_operand": 0}, "max_operand"),
        ({"split": "train", "num_examples": 1, "max_operand": 100}, "max_operand"),
        ({"split": "train", "num_examples": 1, "operations": ""}, "operations"),
        ({"split": "train", "num_examples": 1, "operations": "/"}, "operations"),
        ({"split": "train", "num_examples": 1, "operations": "++"}, "operations"),
        ({"split": "train", "num_examples": 1, "seed": 1.5}, "seed"),
    ],
)
def test_bad_arguments_raise(kwargs, name):
    with pytest.raises(ValueError, match=name):
        make_arithmetic_examples(**kwargs)

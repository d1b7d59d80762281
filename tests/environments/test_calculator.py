"""The calculator task and its ``calculate`` tool, against independent references (Fraction arithmetic, a re-derived
problem set)."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest

from lit_entropy.environments.calculator import (
    CalculatorEnvironment,
    calculate,
    make_calculator_examples,
    train_rows,
    validation_rows,
)
from lit_entropy.environments.calculator import (
    test_rows as calculator_test_rows,
)


def _random_expression(rng: random.Random, depth: int) -> tuple[str, Fraction]:
    """A random expression over + - * / and parentheses with its exact value (Fraction), built bottom-up."""
    if depth == 0 or rng.random() < 0.3:
        n = rng.randint(0, 99)
        return str(n), Fraction(n)
    left, lv = _random_expression(rng, depth - 1)
    right, rv = _random_expression(rng, depth - 1)
    op = rng.choice("+-*/")
    if op == "/" and rv == 0:
        op = "+"
    value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else None}[op]
    return f"({left}{op}{right})", value


def test_calculate_matches_exact_fraction_arithmetic() -> None:
    rng = random.Random(0)
    for _ in range(300):
        text, value = _random_expression(rng, 3)
        got = calculate(text)
        if value.denominator == 1:
            assert got == str(value.numerator), text
        else:
            assert float(got) == pytest.approx(float(value), rel=1e-12), text


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("47*86", "4042"),
        ("3-7", "-4"),
        ("-(2+3)", "-5"),
        ("7//2", "3"),
        ("7%3", "1"),
        ("2**10", "1024"),
        ("6/3", "2"),
        (" 1 + 2 ", "3"),
        ("1.5*2", "3"),
        ("1/4", "0.25"),
    ],
)
def test_calculate_cases(expression: str, expected: str) -> None:
    assert calculate(expression) == expected


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os')",
        "abs(-1)",
        "x+1",
        "(1).real",
        "[1]",
        "lambda: 1",
        "1 if 1 else 2",
        "9**99",
        "10**20*10**20",
        "1+",
        "",
        "'a'*3",
        "True+1",
    ],
)
def test_calculate_refuses_anything_but_bounded_arithmetic(expression: str) -> None:
    with pytest.raises(ValueError):
        calculate(expression)


def test_calculate_errors() -> None:
    with pytest.raises(ZeroDivisionError):
        calculate("1/0")
    with pytest.raises(ValueError, match="longer than"):
        calculate("1+" * 200 + "1")
    with pytest.raises(TypeError, match="string"):
        calculate(12)  # type: ignore[arg-type]


def test_splits_are_disjoint_and_cover_every_problem_with_right_answers() -> None:
    assert validation_rows() == make_calculator_examples("validation", 128)
    splits = {
        "train": train_rows(),
        "validation": make_calculator_examples("validation"),
        "test": calculator_test_rows(),
    }
    assert {k: len(v) for k, v in splits.items()} == {"train": 27000, "validation": 1500, "test": 1500}
    prompts = [r["prompt"] for rows in splits.values() for r in rows]
    expected = {f"{a}{op}{b}=" for op in "+-*" for a in range(100) for b in range(100)}
    assert len(prompts) == len(set(prompts)) and set(prompts) == expected
    for rows in splits.values():
        for r in rows[:500]:
            a, op, b = _split_prompt(r["prompt"])
            assert int(r["answer"]) == {"+": a + b, "-": a - b, "*": a * b}[op]


def _split_prompt(prompt: str) -> tuple[int, str, int]:
    body = prompt.rstrip("=")
    for i, ch in enumerate(body[1:], start=1):  # the first operand has no sign
        if ch in "+-*":
            return int(body[:i]), ch, int(body[i + 1 :])
    raise AssertionError(prompt)


def test_seed_orders_within_a_split_and_prefixes() -> None:
    a = make_calculator_examples("validation", 50, seed=1)
    assert make_calculator_examples("validation", 10, seed=1) == a[:10]
    every = {r["prompt"] for r in make_calculator_examples("validation")}
    assert {r["prompt"] for r in make_calculator_examples("validation", seed=2)} == every
    assert make_calculator_examples("validation", 50, seed=2) != a
    with pytest.raises(ValueError, match="num_examples"):
        make_calculator_examples("test", 1501)
    with pytest.raises(ValueError, match="split"):
        make_calculator_examples("dev", 1)


def test_environment_is_a_trl_tool_environment_with_one_tool() -> None:
    from transformers.utils import get_json_schema  # noqa: PLC0415 - reason: transformers only for this test

    env = CalculatorEnvironment()
    public = [n for n in dir(env) if not n.startswith("_") and callable(getattr(env, n))]
    assert sorted(public) == ["calculate", "reset"]  # TRL's rule: every public method but reset is a tool
    assert env.reset(prompt="2*3=", answer="6") is None  # no first message
    assert env.calculate("2*3") == "6" and env.num_calls == 1
    env.reset(prompt="1+1=", answer="2")
    assert env.num_calls == 0
    schema = get_json_schema(env.calculate)
    assert schema["function"]["name"] == "calculate"
    assert schema["function"]["parameters"]["required"] == ["expression"]
    assert schema["function"]["parameters"]["properties"]["expression"]["type"] == "string"
    assert get_json_schema(calculate)["function"]["parameters"] == schema["function"]["parameters"]

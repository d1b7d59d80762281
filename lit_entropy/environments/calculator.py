"""The calculator task: two-operand arithmetic the tiny model cannot do in its head, and a ``calculate`` tool.

A prompt is ``"47*86="``: operands 0..99, operations ``+ - *``; the answer is the exact integer. The task is
sized so a 0.3M-parameter model answering directly is mostly wrong (two-digit products), while calling
``calculate`` and copying its result is right: reinforcement learning raises the tool-use rate because the
tool pays (``scripts/assets/make_calculator_model.py`` builds a base model that calls it some of the time).

The 30 000 problems are partitioned 90/5/5 into train / validation / test by a fixed internal seed, so the
splits are disjoint whatever ``seed`` a caller passes. ``calculate`` evaluates an arithmetic expression by
walking its syntax tree (numbers, ``+ - * / // % **``, unary signs, parentheses): no ``eval``, no names, no
calls, bounded sizes. The reward is ``exact_match`` on the policy's last turn (multi-turn rewards read the last
assistant turn): ``"4042"`` after the tool's result scores 1, a last turn that is still a tool call scores 0.
"""

from __future__ import annotations

import ast
import math
import operator
import random
from collections.abc import Callable
from typing import Any

__all__ = [
    "CALCULATOR_OPERATIONS",
    "CALCULATOR_SPLITS",
    "CalculatorEnvironment",
    "calculate",
    "make_calculator_examples",
    "test_rows",
    "train_rows",
    "validation_rows",
]

#: Operations of the task's prompts.
CALCULATOR_OPERATIONS = "+-*"
#: Split names and their share of the 3 x 100 x 100 problems.
CALCULATOR_SPLITS = {"train": 0.9, "validation": 0.05, "test": 0.05}
_PARTITION_SEED = 20261206
_MAX_OPERAND = 99
# calculate's bounds: an expression longer than this many characters, a power whose exponent exceeds this, or a
# result whose magnitude exceeds this is refused (a policy must not be able to stall training with 9**9**9).
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30

_BINARY: dict[type[ast.operator], Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression exactly and return the result.

    Args:
        expression: Numbers combined with + - * / // % ** and parentheses, for example "47*86" or "(3+4)/2".

    Returns:
        The result: an integer in decimal, or a decimal fraction when the division is not exact.

    >>> calculate("47*86")
    '4042'
    >>> calculate("(3+4)/2")
    '3.5'
    >>> calculate("2**10-24")
    '1000'
    """
    if not isinstance(expression, str):
        raise TypeError(f"expression must be a string, got {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as err:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from err
    value = _evaluate(tree.body)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"the result of {expression!r} is not finite")
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def _evaluate(node: ast.AST) -> int | float:
    """The value of one node of an arithmetic syntax tree; anything but numbers and arithmetic is refused."""
    # bool is an int subclass: refused like any other non-number constant
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)  # ZeroDivisionError propagates: the policy reads it
        if isinstance(value, complex) or abs(value) > MAX_MAGNITUDE:
            raise ValueError(f"a result beyond +-{MAX_MAGNITUDE:.0e} or not real")
        return value
    raise ValueError(f"only numbers and + - * / // % ** are allowed, got {type(node).__name__}")


class CalculatorEnvironment:
    """The calculator as a tool environment (TRL's ``environment_factory`` duck type): one instance per trajectory.

    ``reset(**row)`` starts a trajectory (no first message: the prompt says everything); the public method
    ``calculate`` is the tool. It counts the calls it answered, the per-trajectory record a user would read back.
    """

    def __init__(self) -> None:
        self.num_calls = 0

    def reset(self, **row: Any) -> None:
        """Start a trajectory for ``row`` (its fields are unused: the prompt carries the problem)."""
        self.num_calls = 0

    def calculate(self, expression: str) -> str:
        """Evaluate an arithmetic expression exactly and return the result.

        Args:
            expression: Numbers combined with + - * / // % ** and parentheses, for example "47*86" or "(3+4)/2".

        Returns:
            The result: an integer in decimal, or a decimal fraction when the division is not exact.
        """
        self.num_calls += 1
        return calculate(expression)


def _problems(split: str) -> list[tuple[int, str, int]]:
    if split not in CALCULATOR_SPLITS:
        raise ValueError(f"split must be one of {tuple(CALCULATOR_SPLITS)}, got {split!r}")
    problems = [
        (a, op, b) for op in CALCULATOR_OPERATIONS for a in range(_MAX_OPERAND + 1) for b in range(_MAX_OPERAND + 1)
    ]
    random.Random(_PARTITION_SEED).shuffle(problems)
    n_val = round(CALCULATOR_SPLITS["validation"] * len(problems))
    n_test = round(CALCULATOR_SPLITS["test"] * len(problems))
    bounds = {"validation": (0, n_val), "test": (n_val, n_val + n_test), "train": (n_val + n_test, len(problems))}
    start, stop = bounds[split]
    return problems[start:stop]


def make_calculator_examples(split: str, num_examples: int | None = None, *, seed: int = 0) -> list[dict[str, str]]:
    """``num_examples`` distinct problems of ``split`` (all of them when None) in the order ``seed`` draws.

    Returns:
        ``{"prompt": "47*86=", "answer": "4042"}`` dicts.
    """
    pool = _problems(split)
    n = len(pool) if num_examples is None else num_examples
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= len(pool):
        raise ValueError(f"num_examples must be an int in [1, {len(pool)}] for split {split!r}, got {num_examples!r}")
    order = list(range(len(pool)))
    random.Random(seed).shuffle(order)
    ops = {"+": operator.add, "-": operator.sub, "*": operator.mul}
    return [{"prompt": f"{a}{op}{b}=", "answer": str(ops[op](a, b))} for a, op, b in (pool[i] for i in order[:n])]


def train_rows() -> list[dict[str, str]]:
    """The train split (27 000 problems) for ``data.train_dataset: lit_entropy.environments.calculator:train_rows``."""
    return make_calculator_examples("train")


def validation_rows() -> list[dict[str, str]]:
    """128 problems of the validation split (``data.num_val_examples`` applies to the embedded tasks only, not to a
    function's rows, so the function keeps validation short)."""
    return make_calculator_examples("validation", 128)


def test_rows() -> list[dict[str, str]]:
    """The test split (1 500 problems)."""
    return make_calculator_examples("test")

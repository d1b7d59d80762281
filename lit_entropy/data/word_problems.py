"""Grade-school word problems, generated without any download: the embedded task for a real chat model.

A problem starts from a quantity of objects a person has, changes it by 1-3 operations told as sentences (gets
more, gives away, multiplies into packs, shares equally), and asks for the result, counted in objects or, when the
last step prices them, in dollars or cents. Every intermediate and final value is a non-negative integer (a share is
drawn only where the division is exact). Several templates per step, names, objects and units vary the wording.

The easy variant (``easy=True``, task ``word_problems_easy``) is one addition of small numbers (2-9 objects, 1-9 more)
asking for the number only: SmolLM2-135M-Instruct is right about a third of the time there at temperature 0.7, so
GRPO has within-group contrast from the first step; on the full task it is right ~5 % of the time.

Splits are disjoint by construction: a problem belongs to the split its text hashes to (8 of 10 buckets train,
1 validation, 1 test), so no problem text is in two splits, whatever the seeds. The same ``(split, count, seed,
operations)`` always gives the same problems.

>>> rows = make_word_problems("train", 2, seed=0, operations=(1, 1))
>>> sorted(rows[0])
['answer', 'operations', 'prompt']
>>> rows[0]["answer"].isdigit() and rows[0]["prompt"].endswith(ANSWER_INSTRUCTION)
True
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "ANSWER_INSTRUCTION",
    "EASY_INSTRUCTION",
    "SPLITS",
    "WORD_PROBLEM_TASKS",
    "WordProblem",
    "WordProblemTask",
    "make_word_problems",
    "split_of",
]

#: What the prompt asks of the answer's form; the reward (``word_problem``) reads the final number of the reply.
ANSWER_INSTRUCTION = "Give the final answer as a single number on the last line, like this: Answer: 42"
#: The easy variant's instruction: a bare number, no worked example to copy (the 135 M model repeats the "42").
EASY_INSTRUCTION = "Reply with the number only."
#: Split -> hash buckets (of 10) it owns.
SPLITS: dict[str, range] = {"train": range(0, 8), "validation": range(8, 9), "test": range(9, 10)}


@dataclass(frozen=True)
class WordProblemTask:
    """What an embedded word-problem task draws: (fewest, most) operations, or the easy variant."""

    operations: tuple[int, int] = (1, 3)
    """(fewest, most) operations per problem, each in 1..3 (ignored by the easy variant: one addition)."""
    easy: bool = False
    """One addition of small numbers (2-9, 1-9 more) and :data:`EASY_INSTRUCTION`."""


#: ``data.train_dataset`` names -> what the task draws.
WORD_PROBLEM_TASKS: dict[str, WordProblemTask] = {
    "word_problems": WordProblemTask((1, 3)),
    "word_problems_1op": WordProblemTask((1, 1)),
    "word_problems_easy": WordProblemTask((1, 1), easy=True),
}

_NAMES = (
    "Ava", "Ben", "Chloe", "Daniel", "Emma", "Farid", "Grace", "Hiro", "Isla", "Jamal", "Keiko", "Liam", "Maya",
    "Noah", "Olivia", "Priya", "Quinn", "Rosa", "Samir", "Tara", "Uma", "Victor", "Wen", "Yusuf", "Zoe",
)  # fmt: skip
# (singular, plural)
_OBJECTS = (
    ("apple", "apples"), ("marble", "marbles"), ("pencil", "pencils"), ("sticker", "stickers"), ("cookie", "cookies"),
    ("book", "books"), ("shell", "shells"), ("stamp", "stamps"), ("balloon", "balloons"), ("card", "cards"),
    ("orange", "oranges"), ("toy car", "toy cars"), ("cupcake", "cupcakes"), ("button", "buttons"),
    ("flower", "flowers"), ("egg", "eggs"), ("candle", "candles"), ("ribbon", "ribbons"),
)  # fmt: skip
_UNITS = (("dollars", 2, 9), ("cents", 5, 60))  # unit, lowest and highest price per object


@dataclass(frozen=True)
class WordProblem:
    """One problem: its text (without the answer instruction), the integer answer and the operations used."""

    text: str
    answer: int
    operations: int


def split_of(text: str) -> str:
    """The split that owns the problem ``text`` (a stable hash, independent of seeds and of Python's hash salt)."""
    bucket = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def make_word_problems(
    split: str, count: int, *, seed: int = 0, operations: tuple[int, int] = (1, 3), easy: bool = False
) -> list[dict[str, str | int]]:
    """``count`` distinct problems of ``split`` as rows ``{"prompt", "answer", "operations"}``.

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        count: Problems to return.
        seed: Seeds the generator (the split decides which generated problems are kept).
        operations: (fewest, most) operations per problem, each in 1..3.
        easy: Draw the easy variant instead: one addition of small numbers, :data:`EASY_INSTRUCTION`.

    Returns:
        Rows whose ``prompt`` is the problem followed by :data:`ANSWER_INSTRUCTION` (:data:`EASY_INSTRUCTION`) (a
        user message: render it with the model's chat template) and whose ``answer`` is the integer as a string.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    low, high = operations
    if not (isinstance(low, int) and isinstance(high, int) and 1 <= low <= high <= 3):
        raise ValueError(f"operations must be (fewest, most) with 1 <= fewest <= most <= 3, got {operations!r}")
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, got {count!r}")
    # the easy variant has its own stream: the other tasks' problems stay what they were
    rng = random.Random(f"word_problems{'_easy' if easy else ''}/{seed}/{split}")
    instruction = EASY_INSTRUCTION if easy else ANSWER_INSTRUCTION
    rows: list[dict[str, str | int]] = []
    seen: set[str] = set()
    for _ in range(count * 200):
        problem = _draw_easy(rng) if easy else _draw(rng, rng.randint(low, high))
        if problem.text in seen or split_of(problem.text) != split:
            continue
        seen.add(problem.text)
        rows.append(
            {
                "prompt": f"{problem.text}\n{instruction}",
                "answer": str(problem.answer),
                "operations": problem.operations,
            }
        )
        if len(rows) == count:
            return rows
    raise ValueError(f"could not draw {count} distinct {split!r} problems with operations={operations!r}")


def _draw(rng: random.Random, operations: int) -> WordProblem:
    """One problem with ``operations`` steps; the last may price the objects (answer in a unit)."""
    name, friend = rng.sample(_NAMES, 2)
    singular, plural = rng.choice(_OBJECTS)
    value = rng.randint(3, 40)
    sentences = [
        rng.choice(
            (
                f"{name} has {value} {plural}.",
                f"{name} starts the day with {value} {plural}.",
                f"There are {value} {plural} in {name}'s bag.",
                f"{name} collected {value} {plural} last week.",
            )
        )
    ]
    priced = operations >= 2 and rng.random() < 0.3  # the last operation turns the count into money
    for _ in range(operations - 1 if priced else operations):
        step = rng.choice([s for s in _STEPS if s.allowed(value)])
        value, sentence = step.apply(rng, value, name, friend, singular, plural)
        sentences.append(sentence)
    if priced:
        unit, cheapest, dearest = rng.choice(_UNITS)
        price = rng.randint(cheapest, dearest)
        sentences.append(f"{name} sells each {singular} for {price} {unit}.")
        question = f"How many {unit} does {name} get for all of the {plural}?"
        value *= price
    else:
        question = rng.choice(
            (f"How many {plural} does {name} have now?", f"How many {plural} are left with {name} in the end?")
        )
    return WordProblem(" ".join([*sentences, question]), value, operations)


def _draw_easy(rng: random.Random) -> WordProblem:
    """One addition of small numbers: "Ava has 4 apples. Ben gives Ava 3 more apples. How many ...?" (answer 7)."""
    name, friend = rng.sample(_NAMES, 2)
    _, plural = rng.choice(_OBJECTS)
    start, more = rng.randint(2, 9), rng.randint(1, 9)
    opening = rng.choice((f"{name} has {start} {plural}.", f"There are {start} {plural} in {name}'s bag."))
    change = rng.choice((f"{friend} gives {name} {more} more {plural}.", f"Then {name} buys {more} more {plural}."))
    return WordProblem(f"{opening} {change} How many {plural} does {name} have now?", start + more, 1)


@dataclass(frozen=True)
class _Step:
    """One operation: when it may apply to the current value and how it changes and tells it."""

    allowed: Callable[[int], bool]
    apply: Callable[..., tuple[int, str]]


def _add(rng: random.Random, value: int, name: str, friend: str, singular: str, plural: str) -> tuple[int, str]:
    n = rng.randint(2, 30)
    sentence = rng.choice(
        (
            f"{friend} gives {name} {n} more {plural}.",
            f"Then {name} buys {n} more {plural}.",
            f"{name} finds {n} more {plural} in the garden.",
        )
    )
    return value + n, sentence


def _subtract(rng: random.Random, value: int, name: str, friend: str, singular: str, plural: str) -> tuple[int, str]:
    n = rng.randint(1, value - 1)
    sentence = rng.choice(
        (
            f"{name} gives {n} {plural} to {friend}.",
            f"Then {name} loses {n} of the {plural}.",
            f"{friend} borrows {n} {plural} from {name} and keeps them.",
        )
    )
    return value - n, sentence


def _multiply(rng: random.Random, value: int, name: str, friend: str, singular: str, plural: str) -> tuple[int, str]:
    n = rng.randint(2, 5)
    packs = "pack" if n == 2 else "packs"
    sentence = rng.choice(
        (
            f"Then {name} buys {n - 1} more {packs} with as many {plural} as {name} already has.",
            f"By the end of the month {name} has {n} times as many {plural}.",
        )
    )
    return value * n, sentence


def _divisors(value: int) -> list[int]:
    return [k for k in range(2, 7) if value % k == 0 and value // k >= 1]


def _share(rng: random.Random, value: int, name: str, friend: str, singular: str, plural: str) -> tuple[int, str]:
    k = rng.choice(_divisors(value))
    sentence = rng.choice(
        (
            f"{name} splits the {plural} equally into {k} boxes and keeps one box.",
            f"{name} shares them equally with {k - 1} {'friend' if k == 2 else 'friends'}, keeping one equal share.",
        )
    )
    return value // k, sentence


_STEPS = (
    _Step(lambda value: value < 500, _add),
    _Step(lambda value: value >= 2, _subtract),
    _Step(lambda value: value <= 60, _multiply),
    _Step(lambda value: bool(_divisors(value)), _share),
)

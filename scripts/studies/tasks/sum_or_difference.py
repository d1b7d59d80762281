"""Sum-or-difference forking task (download-free, seeded): a strategy choice whose execution is not trivial.

A prompt is ``"a,b?"`` with ``a`` in 0..99 and ``b`` in 0..9 (1000 problems). The response starts with a
*strategy* letter and then writes the equation and its result: ``"L57+8=65"`` (sum) or ``"R57-8=49"``
(difference). The rule: the difference is right when ``a`` ends in 0 or 5 (20 % of prompts), else the sum.
So the strategy letter is a real decision (the minority strategy ``R`` is right on a fifth of the prompts)
and the execution is arithmetic a tiny model gets wrong now and then, unlike the near-deterministic copies of
:mod:`scripts.studies.tasks.forking`. Always answering ``L`` scores 0.8 at best (:func:`always_sum_share`).

**Correct responses.** A response is correct when it is one of the *canonical* correct responses of its
prompt: ``L{a}+{b}={a+b}`` or ``R{a}-{b}={a-b}`` whose result equals the rule's answer. When ``b == 0`` both
are correct (``a + 0 == a - 0``). Restricting credit to well-formed equations (rather than "the last number
is right") makes the set of correct responses explicit (one or two strings), so the probability that a sample
is correct is the sum of their sequence probabilities: pass@k and avg@k are exact (teacher forcing).

The 1000 problems are partitioned 700/150/150 into train/validation/test by a fixed internal seed, whatever
``seed`` a caller passes. Rows carry their ``class``: ``"sum"`` or ``"diff"`` (the rule's strategy).
"""

from __future__ import annotations

import random

__all__ = [
    "SOD_ALPHABET",
    "SOD_BASE_PRIOR_L",
    "SOD_SPLITS",
    "always_sum_share",
    "correct_responses",
    "make_sod_examples",
    "parse_prompt",
    "reward",
    "rule_strategy",
    "sod_problems",
    "strategy_response",
    "test_rows",
    "train_rows",
]

#: Every character of a prompt or a response.
SOD_ALPHABET = "0123456789,?LR+-="
#: Share of ``L`` in the base model's supervised responses, whatever the rule (the skewed "75/25" prior).
SOD_BASE_PRIOR_L = 0.75
#: Split names and sizes (problems); disjoint.
SOD_SPLITS = {"train": 700, "validation": 150, "test": 150}
_PARTITION_SEED = 20261204


def sod_problems() -> list[tuple[int, int]]:
    """All ``(a, b)`` problems, a in 0..99, b in 0..9, in a fixed order."""
    return [(a, b) for a in range(100) for b in range(10)]


def rule_strategy(a: int) -> str:
    """``"R"`` (difference) when ``a`` ends in 0 or 5, else ``"L"`` (sum)."""
    return "R" if a % 5 == 0 else "L"


def strategy_response(strategy: str, a: int, b: int) -> str:
    """Canonical response of ``strategy`` (``L`` sum, ``R`` difference) on ``(a, b)``, arithmetic right."""
    if strategy == "L":
        return f"L{a}+{b}={a + b}"
    if strategy == "R":
        return f"R{a}-{b}={a - b}"
    raise ValueError(f"strategy must be 'L' or 'R', got {strategy!r}")


def correct_responses(a: int, b: int) -> list[str]:
    """The canonical responses whose result is the rule's answer (two when ``b == 0``, else one)."""
    target = a - b if rule_strategy(a) == "R" else a + b
    return [r for r in (strategy_response("L", a, b), strategy_response("R", a, b)) if int(r.split("=")[1]) == target]


def parse_prompt(prompt: str) -> tuple[int, int]:
    """``"57,8?"`` -> ``(57, 8)``."""
    body = prompt.strip()
    if not body.endswith("?") or body.count(",") != 1:
        raise ValueError(f"prompt must look like 'a,b?', got {prompt!r}")
    a, b = body[:-1].split(",")
    return int(a), int(b)


def make_sod_examples(split: str, seed: int = 0, *, prior_l: float | None = None, n: int | None = None):
    """Rows ``{"prompt", "answer", "class"}`` of ``split`` (all its problems, shuffled by ``seed``; first ``n``).

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        seed: orders the rows (and draws the strategies when ``prior_l`` is given).
        prior_l: when given, ``answer`` is the response of ``L`` with this probability, else of ``R``, *whatever
            the rule* (the base model's supervised data); None: ``answer`` holds the correct responses joined by
            ``|`` (:func:`correct_responses`; what :func:`reward` reads).
        n: number of rows; rows cycle through the split's problems (a new shuffle each pass) when ``n`` exceeds
            its size. None: every problem once.
    """
    if split not in SOD_SPLITS:
        raise ValueError(f"split must be one of {tuple(SOD_SPLITS)}, got {split!r}")
    problems = sod_problems()
    random.Random(_PARTITION_SEED).shuffle(problems)
    start = 0
    for name, size in SOD_SPLITS.items():
        if name == split:
            problems = problems[start : start + size]
            break
        start += size
    rng = random.Random(f"sod/{split}/{seed}")
    n = len(problems) if n is None else n
    rows: list[dict[str, str]] = []
    while len(rows) < n:
        order = list(problems)
        rng.shuffle(order)
        for a, b in order[: n - len(rows)]:
            rule = rule_strategy(a)
            if prior_l is None:
                answer = "|".join(correct_responses(a, b))
            else:
                answer = strategy_response("L" if rng.random() < prior_l else "R", a, b)
            rows.append(
                {
                    "prompt": f"{a},{b}?",
                    "answer": answer,
                    "class": "diff" if rule == "R" else "sum",
                }
            )
    return rows


def train_rows() -> list[dict[str, str]]:
    """The studies' training prompts (``data.train_dataset: scripts.studies.tasks.sum_or_difference:train_rows``)."""
    return make_sod_examples("train")


def test_rows() -> list[dict[str, str]]:
    """The 150 test prompts the studies evaluate on."""
    return make_sod_examples("test")


def always_sum_share(split: str = "test") -> float:
    """Share of ``split``'s prompts that the policy "always ``L``, arithmetic right" gets right (its pass@k for
    every k): the floor a collapsed policy sits on."""
    rows = make_sod_examples(split)
    return sum(strategy_response("L", *parse_prompt(r["prompt"])) in r["answer"].split("|") for r in rows) / len(rows)


def reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion is one of the ``|``-separated correct responses in its answer, else 0.0.

    Importable as ``reward.fn: scripts.studies.tasks.sum_or_difference:reward`` (answers as written by
    :func:`make_sod_examples` without ``prior_l``).
    """
    if len(completions) != len(answers):
        raise ValueError(f"completions and answers must have equal lengths, got {len(completions)}, {len(answers)}")
    return [float(c.strip() in a.split("|")) for c, a in zip(completions, answers, strict=True)]

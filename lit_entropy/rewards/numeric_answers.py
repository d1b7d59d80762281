"""Numeric answers: the final number of a completion and the ``word_problem`` reward (equal numbers)."""

from __future__ import annotations

import math
import re

from lit_entropy.rewards.math_answers import has_math_verify, last_boxed_content, math_verify_reward
from lit_entropy.rewards.scoring import check_equal_lengths

__all__ = ["final_number", "word_problem_reward"]

# A number as people write it: optional sign and currency, digits with thousands commas or plain, decimals.
_NUMBER = re.compile(r"-?\$?\s?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
# "Answer: 12", "answer is 12", "final answer = 12" (the word problems ask for "Answer: <number>").
_ANSWER_MARKER = re.compile(r"answer\s*(?:is|:|=)", re.IGNORECASE)


def final_number(text: str) -> float | None:
    """The completion's final numeric answer, or None.

    Where the text says ``Answer: ...`` (or "answer is", "answer ="), the first number after the last such
    marker; else the content of the last ``\\boxed{}``; else the last number in the text. Thousands commas,
    a ``$`` sign, units and trailing text are ignored: ``"Answer: $1,200 dollars."`` gives 1200.0.

    >>> final_number("3 + 4 = 7 apples, so she has 7 apples left.")
    7.0
    >>> final_number("Answer: 1,250 cents. (That is 12.5 dollars.)")
    1250.0
    >>> final_number("no idea") is None
    True
    """
    markers = list(_ANSWER_MARKER.finditer(text))
    if markers:
        found = _NUMBER.search(text, markers[-1].end())
        if found is not None:
            return _to_float(found.group())
    boxed = last_boxed_content(text)
    if boxed is not None and (found := _NUMBER.search(boxed)) is not None:
        return _to_float(found.group())
    numbers_found = _NUMBER.findall(text)
    return _to_float(numbers_found[-1]) if numbers_found else None


def _to_float(number: str) -> float:
    return float(number.replace("$", "").replace(",", "").replace(" ", ""))


def word_problem_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion's final number (:func:`final_number`) equals the numeric answer, else 0.0.

    Built for ``lit_entropy.data.word_problems`` (``"Answer: <number>"``), usable for any task with a numeric
    answer. A completion with no number at all is judged by :func:`math_verify_reward` where math-verify is
    installed (it reads e.g. ``\\frac{24}{2}``), else scores 0.0.

    >>> word_problem_reward(["So the answer is 1,200 dollars.", "Answer: 12", "I think 3."], ["1200", "13", "3"])
    [1.0, 0.0, 1.0]
    """
    check_equal_lengths(completions, answers)
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        predicted, gold = final_number(completion), final_number(answer)
        if predicted is not None and gold is not None:
            rewards.append(float(math.isclose(predicted, gold, rel_tol=0.0, abs_tol=1e-9)))
        elif predicted is None and has_math_verify():
            rewards.append(math_verify_reward([completion], [answer])[0])
        else:
            rewards.append(0.0)
    return rewards

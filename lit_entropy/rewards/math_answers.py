"""Mathematical answers: the last ``\\boxed{}`` of a completion, its final answer, and the ``math_verify`` reward
(equality by math-verify, which reads LaTeX: ``\\frac{1}{2}`` equals ``0.5``)."""

from __future__ import annotations

import importlib.util
import inspect
import threading
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from lit_entropy.rewards.scoring import check_equal_lengths

__all__ = ["final_answer", "has_math_verify", "last_boxed_content", "math_verify_reward"]

# math_verify's own default per-call limit (seconds), used where its signal-based timeout can work.
_MATH_VERIFY_TIMEOUT_S = 5
_BOXED_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``) in ``text``, braces balanced; None if none.

    A backslash escapes the next character, so ``\\{`` and ``\\}`` do not count as braces. When the last
    box is not closed (a truncated completion) the result is None: the final answer is incomplete.
    """
    start = max(text.rfind(command + "{") for command in _BOXED_COMMANDS)
    if start < 0:
        return None
    begin = text.index("{", start) + 1
    depth = 1
    i = begin
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


@lru_cache(maxsize=1)
def _math_verify_api() -> tuple[Callable[..., Any], Callable[..., Any], str | None, str | None, type[BaseException]]:
    """``parse``, ``verify``, the names of their timeout arguments and the timeout exception of math_verify."""
    try:
        # deferred: math-verify (sympy) takes seconds to import; only the math_verify reward needs it
        from math_verify import parse, verify
    except ImportError as err:
        raise ImportError(
            "reward_fn='math_verify' needs the math-verify package, which is not installed: "
            "pip install 'math-verify>=0.7' (a dependency of lit-entropy: pip install -e . installs it)"
        ) from err

    try:  # a BaseException subclass, so ``except Exception`` would let it through
        from math_verify.errors import TimeoutException
    except ImportError:  # releases without it raise plain exceptions
        TimeoutException = Exception  # noqa: N806

    # Older releases lack one or both arguments (and then have no signal-based timeout to switch off).
    parse_timeout = "parsing_timeout" if "parsing_timeout" in inspect.signature(parse).parameters else None
    verify_timeout = "timeout_seconds" if "timeout_seconds" in inspect.signature(verify).parameters else None
    return parse, verify, parse_timeout, verify_timeout, TimeoutException


def final_answer(text: str) -> str | None:
    """The completion's final answer: the last ``\\boxed{}``, else the text after the last ``Answer:``.

    The ``Answer:`` line is the format DAPO-Math-17k prompts ask for ("The last line of your response
    should be of the form Answer: $Answer"), as verl's ``math_dapo`` scorer reads it.
    """
    boxed = last_boxed_content(text)
    if boxed is not None:
        return boxed
    marker = text.rfind("Answer:")
    if marker < 0:
        return None
    line = text[marker + len("Answer:") :].split("\n", 1)[0].strip().strip("$").strip()
    return line or None


def _gold_latex(answer: str) -> str:
    """Ground truth as a ``\\boxed{}`` expression: drop surrounding ``$`` and an existing box."""
    text = answer.strip()
    boxed = last_boxed_content(text)
    if boxed is not None:
        text = boxed
    return "\\boxed{" + text.strip().strip("$").strip() + "}"


def math_verify_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion's final answer is mathematically equal to the answer, else 0.0.

    The final answer is the last ``\\boxed{}``, or else the last ``Answer:`` line (:func:`final_answer`).

    Equality is ``math_verify.verify(parse(gold), parse(prediction))``, which accepts e.g.
    ``\\boxed{\\frac{1}{2}}`` for ``"0.5"`` or ``"1/2"``. A completion without a complete box, or any
    parsing/verification error, scores 0.0. math_verify's timeouts use ``signal.alarm``, which only works
    in the main thread: there they stay on (5 s per call, e.g. ``\\boxed{9^{9^{9^{9}}}}`` scores 0 after
    5 s); elsewhere (a worker thread) they are disabled so that the call works at all, and such a
    pathological expression can then block for minutes. Call it from the main thread (a Lightning
    ``training_step`` runs there) unless the completions are trusted.
    """
    check_equal_lengths(completions, answers)
    parse, verify, parse_timeout, verify_timeout, timeout_error = _math_verify_api()
    seconds = _MATH_VERIFY_TIMEOUT_S if threading.current_thread() is threading.main_thread() else None
    parse_kwargs = {parse_timeout: seconds} if parse_timeout else {}
    verify_kwargs = {verify_timeout: seconds} if verify_timeout else {}
    gold_cache: dict[str, Any] = {}  # a GRPO group repeats each answer K times: parse it once
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        predicted = final_answer(completion)
        if predicted is None or not predicted.strip():
            rewards.append(0.0)
            continue
        try:
            if answer not in gold_cache:
                gold_cache[answer] = parse(_gold_latex(answer), **parse_kwargs)
            target = parse("\\boxed{" + predicted + "}", **parse_kwargs)
            correct = bool(gold_cache[answer]) and bool(target) and verify(gold_cache[answer], target, **verify_kwargs)
        except (Exception, timeout_error):  # a reward must never crash training: bad or timed-out answers score 0
            correct = False
        rewards.append(float(correct))
    return rewards


@lru_cache(maxsize=1)
def has_math_verify() -> bool:
    """math-verify is installed (found without importing it: its import takes seconds)."""
    return importlib.util.find_spec("math_verify") is not None

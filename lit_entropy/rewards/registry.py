"""The built-in rewards by name (``model.reward.fn``), ``exact_match`` among them, and resolving a reward setting:
a name, an import path ``pkg.module:function`` or a callable."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lit_entropy.extensions import import_object
from lit_entropy.rewards.math_answers import math_verify_reward
from lit_entropy.rewards.numeric_answers import word_problem_reward
from lit_entropy.rewards.scoring import RewardFunction, check_equal_lengths

__all__ = ["REWARD_FUNCTIONS", "exact_match_reward", "resolve_reward_fn"]


def exact_match_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion's first line, stripped, equals the stripped answer, else 0.0.

    The completion is stripped of surrounding whitespace, then cut at its first newline (the model may
    keep talking after the answer line); used by the synthetic arithmetic task (``"68"`` vs ``"68"``).
    """
    check_equal_lengths(completions, answers)
    return [float(c.strip().split("\n", 1)[0].strip() == a.strip()) for c, a in zip(completions, answers, strict=True)]


#: Built-in reward functions by the names ``resolve_reward_fn`` accepts.
REWARD_FUNCTIONS: dict[str, RewardFunction] = {
    "exact_match": exact_match_reward,
    "math_verify": math_verify_reward,
    "word_problem": word_problem_reward,
}


def resolve_reward_fn(spec: str | Callable[..., Any], setting: str = "model.reward.fn") -> RewardFunction:
    """Turn a reward setting into a reward function.

    Args:
        spec: A callable (returned as is); a built-in name (``"exact_match"``, ``"math_verify"``); or an
            import path ``"package.module:function"`` or ``"package.module.function"``, found on ``sys.path``
            or in the working directory (:func:`lit_entropy.extensions.import_object`). An imported class is
            instantiated without arguments (its instances must be callable).
        setting: The dotted setting ``spec`` came from, for messages.

    Raises:
        ValueError: ``<setting>: <what is wrong>, got <spec>`` when ``spec`` cannot be imported or does not
            give a callable.
    """
    if callable(spec):
        return spec
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"{setting}: expected a reward name, an import path or a callable, got {spec!r}")
    spec = spec.strip()
    if spec in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[spec]
    if ":" not in spec and "." not in spec:
        raise ValueError(
            f"{setting}: expected a built-in reward ({', '.join(sorted(REWARD_FUNCTIONS))}) or an import path "
            f"'package.module:function', got {spec!r}"
        )
    target = import_object(spec, setting, instantiate_classes=True)
    if not callable(target):
        raise ValueError(f"{setting}: resolves to a {type(target).__name__}, which is not callable, got {spec!r}")
    return target

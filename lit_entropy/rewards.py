"""Rewards for verifiable tasks: batched ``(completions, answers) -> scores``.

A reward function takes the decoded completions and the ground-truth answers of the same rows (equal
lengths; a GRPO group repeats its prompt's answer K times) and returns one float per row, usually 0.0 or
1.0, or a mapping of named components, each with one float per row (``{"correct": [...], "format": [...]}``): the
reward is then their sum weighted by ``model.reward.component_weights`` (TRL's ``reward_weights``), the ``gdpo``
estimator normalises each component on its own and the dashboard shows each (``train/reward_component/<name>``).
Reward functions run in the training process, possibly outside the main thread, so none may rely on
process-wide signal handlers.
"""

from __future__ import annotations

import importlib.util
import inspect
import math
import numbers
import re
import threading
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from lit_entropy.agents.scoring import score_trajectories
from lit_entropy.extensions import import_object
from lit_entropy.rollout.base import RolloutBatch

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunction",
    "RewardFunctionError",
    "RewardScores",
    "check_rewards",
    "compute_reward_scores",
    "compute_rewards",
    "exact_match_reward",
    "final_answer",
    "final_number",
    "last_boxed_content",
    "math_verify_reward",
    "resolve_reward_fn",
    "score_responses",
    "score_rollout",
    "word_problem_reward",
]

# math_verify's own default per-call limit (seconds), used where its signal-based timeout can work.
_MATH_VERIFY_TIMEOUT_S = 5
_BOXED_COMMANDS = ("\\boxed", "\\fbox")


@runtime_checkable
class RewardFunction(Protocol):
    """Batched reward: ``fn(completions, answers)`` returns ``len(completions)`` floats.

    Args:
        completions: Decoded completion text (without the prompt), one per row.
        answers: Ground-truth answer of each row, same length as ``completions``.
    """

    def __call__(self, completions: list[str], answers: list[str]) -> list[float]: ...


def _check_lengths(completions: Sequence[str], answers: Sequence[str]) -> None:
    if len(completions) != len(answers):
        raise ValueError(
            f"completions and answers must have equal lengths, got len(completions)={len(completions)} "
            f"and len(answers)={len(answers)}"
        )


class RewardFunctionError(ValueError):
    """A reward function raised, or returned something other than one finite number per completion.

    The message names the setting (``model.reward.fn``), the function and the failing item; the CLI prints
    it as one line (exit status 1).
    """


class RewardScores(NamedTuple):
    """One reward call's scores.

    Attributes:
        rewards: float32 ``[N]``; with components, their weighted sum.
        components: float32 ``[N]`` per component name, in the order the function gave them, or None when it
            returned plain numbers.
    """

    rewards: Tensor
    components: dict[str, Tensor] | None = None


def compute_rewards(
    fn: Callable[..., Any],
    completions: list[str],
    answers: list[str],
    *,
    fn_name: str,
    group_size: int = 1,
    setting: str = "model.reward.fn",
) -> Tensor:
    """``fn(completions, answers)`` checked by :func:`check_rewards`, as a float32 ``[len(completions)]`` tensor (named
    components summed with weight 1; :func:`compute_reward_scores` keeps them and takes weights)."""
    return compute_reward_scores(fn, completions, answers, fn_name=fn_name, group_size=group_size, setting=setting)[0]


def compute_reward_scores(
    fn: Callable[..., Any],
    completions: list[str],
    answers: list[str],
    *,
    fn_name: str,
    group_size: int = 1,
    setting: str = "model.reward.fn",
    weights: Mapping[str, float] | None = None,
) -> RewardScores:
    """``fn(completions, answers)`` checked: one float32 reward per completion, or named components (a mapping of
    name to one number per completion, each checked by :func:`check_rewards`) and their sum weighted by ``weights``
    (1 for a name it lacks).

    Args:
        fn: The reward function.
        completions: Decoded completions; rows ``i * group_size ... (i + 1) * group_size - 1`` answer prompt ``i``.
        answers: Ground truth per row.
        fn_name: How the user named ``fn`` (the setting's value), for messages.
        group_size: Completions per prompt, to name the prompt of a failing item.
        setting: The dotted setting ``fn`` came from.

    Raises:
        RewardFunctionError: ``fn`` raised (the first item that raises on its own is named, with its prompt
            index and an excerpt of the completion) or returned a bad value.
    """
    try:
        values = fn(completions, answers)
    except Exception as err:  # a user's function: whatever it raises is reported with the item it failed on
        item = _failing_item(fn, completions, answers)
        if item is None:
            where = f"on a batch of {len(completions)} completions (no single completion fails alone)"
        else:
            prompt, sample = divmod(item, max(group_size, 1))
            where = (
                f"on item {item} (prompt {prompt}, sample {sample}: completion {_short_repr(completions[item], 60)}, "
                f"answer {_short_repr(answers[item], 30)})"
            )
        error = " ".join(f"{type(err).__name__}: {err}".split())
        raise RewardFunctionError(
            f"{setting}: reward function {fn_name!r} raised {_short_repr_text(error, 160)} {where}, got {fn_name!r}"
        ) from err
    if not isinstance(values, Mapping):
        return RewardScores(check_rewards(fn_name, values, len(completions), setting=setting))
    if not values or not all(isinstance(name, str) and name for name in values):
        raise RewardFunctionError(
            f"{setting}: reward function {fn_name!r} returned a mapping; it must map component names (non-empty "
            f"strings) to one number per completion, got keys {_short_repr(list(values))}"
        )
    components = {
        name: check_rewards(f"{fn_name}[{name}]", part, len(completions), setting=setting)
        for name, part in values.items()
    }
    total = sum(float((weights or {}).get(name, 1.0)) * part for name, part in components.items())
    return RewardScores(torch.as_tensor(total, dtype=torch.float32), components)


def score_responses(
    fn: Callable[..., Any], fn_name: str, tokenizer: Any, rollout: RolloutBatch, answers: list[str], num_samples: int
) -> tuple[Tensor, list[str]]:
    """:func:`score_rollout`'s rewards ``[N]`` and completions (components summed with weight 1)."""
    scores, completions = score_rollout(fn, fn_name, tokenizer, rollout, answers, num_samples)
    return scores.rewards, completions


def score_rollout(
    fn: Callable[..., Any],
    fn_name: str,
    tokenizer: Any,
    rollout: RolloutBatch,
    answers: list[str],
    num_samples: int,
    weights: Mapping[str, float] | None = None,
) -> tuple[RewardScores, list[str]]:
    """Decode a rollout batch's responses and score them: :class:`RewardScores` (:func:`compute_reward_scores`) and
    the completions.

    Args:
        fn: the reward function; ``fn_name`` names it in errors.
        tokenizer: decodes the responses (special tokens skipped, positions outside the response mask as padding).
        rollout: ``N`` = prompts x ``num_samples`` sampled rows, grouped by prompt.
        answers: one per prompt, shared by its ``num_samples`` rows.
        num_samples: samples per prompt (the group size).
        weights: ``model.reward.component_weights``.
    """
    if rollout.trajectories is not None:  # multi-turn rows: the last policy turns, plus the environment's reward
        args = (compute_reward_scores, fn, fn_name, rollout.trajectories, answers, num_samples, weights)
        return score_trajectories(*args)
    responses = rollout.responses.masked_fill(~rollout.response_mask, tokenizer.pad_token_id or 0)
    completions = tokenizer.batch_decode(responses, skip_special_tokens=True)
    rows = [a for a in answers for _ in range(num_samples)]
    scores = compute_reward_scores(fn, completions, rows, fn_name=fn_name, group_size=num_samples, weights=weights)
    return scores, completions


def _failing_item(fn: Callable[..., Any], completions: list[str], answers: list[str], limit: int = 64) -> int | None:
    """The first of (at most ``limit``) items that makes ``fn`` raise on its own, or None."""
    for index, (completion, answer) in enumerate(zip(completions[:limit], answers[:limit], strict=True)):
        try:
            fn([completion], [answer])
        except Exception:  # the item the batch call failed on
            return index
    return None


def _short_repr_text(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def check_rewards(fn_name: str, values: Any, expected_len: int, setting: str = "model.reward.fn") -> Tensor:
    """Check one reward call's output and return it as a float32 ``[expected_len]`` tensor.

    A reward function must return one finite real number per completion (a list, tuple, numpy array or
    1-d tensor). Anything else is an error naming the function, the index of the first offending item
    and its value: a wrong length, a string, ``None``, a bool-free non-number, NaN or +-inf. There is no
    silent fallback: an inf is never read as "correct" and a NaN never becomes 0.

    Args:
        fn_name: The reward function's name for messages (e.g. the ``model.reward.fn`` setting).
        values: What the function returned.
        expected_len: Number of completions it was given.
        setting: The dotted setting the function came from, for messages.

    Raises:
        RewardFunctionError: Naming ``setting``, ``fn_name`` and the first offending item.
    """
    where = f"{setting}: reward function {fn_name!r}"
    if isinstance(values, Tensor):
        if values.dim() != 1:
            raise RewardFunctionError(
                f"{where} must return one number per completion ({expected_len}), got a tensor of shape "
                f"{tuple(values.shape)}"
            )
        values = values.detach().cpu().tolist()
    elif hasattr(values, "tolist") and not isinstance(values, (str, bytes)):  # numpy arrays
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise RewardFunctionError(
            f"{where} must return a list of {expected_len} floats (one per completion), got "
            f"{type(values).__name__}: {_short_repr(values)}"
        )
    if len(values) != expected_len:
        raise RewardFunctionError(
            f"{where} returned {len(values)} rewards for {expected_len} completions; it must return exactly one "
            f"number per completion"
        )
    out = []
    for index, value in enumerate(values):
        if not isinstance(value, numbers.Real):  # bools are numbers (True = 1.0)
            raise RewardFunctionError(
                f"{where}: item {index} is {_short_repr(value)} ({type(value).__name__}), not a number; "
                f"a reward must be a finite float"
            )
        number = float(value)
        if not math.isfinite(number):
            raise RewardFunctionError(
                f"{where}: item {index} is {number}; rewards must be finite (NaN and inf are refused, "
                f"never counted as correct or as 0)"
            )
        out.append(number)
    return torch.tensor(out, dtype=torch.float32)


def _short_repr(value: Any, limit: int = 80) -> str:
    return _short_repr_text(repr(value), limit)


def exact_match_reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion's first line, stripped, equals the stripped answer, else 0.0.

    The completion is stripped of surrounding whitespace, then cut at its first newline (the model may
    keep talking after the answer line); used by the synthetic arithmetic task (``"68"`` vs ``"68"``).
    """
    _check_lengths(completions, answers)
    return [float(c.strip().split("\n", 1)[0].strip() == a.strip()) for c, a in zip(completions, answers, strict=True)]


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
    _check_lengths(completions, answers)
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
    _check_lengths(completions, answers)
    rewards = []
    for completion, answer in zip(completions, answers, strict=True):
        predicted, gold = final_number(completion), final_number(answer)
        if predicted is not None and gold is not None:
            rewards.append(float(math.isclose(predicted, gold, rel_tol=0.0, abs_tol=1e-9)))
        elif predicted is None and _has_math_verify():
            rewards.append(math_verify_reward([completion], [answer])[0])
        else:
            rewards.append(0.0)
    return rewards


@lru_cache(maxsize=1)
def _has_math_verify() -> bool:
    return importlib.util.find_spec("math_verify") is not None


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

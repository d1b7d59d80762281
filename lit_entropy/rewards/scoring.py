"""Calling a reward function and checking what it returns: one finite float per completion, or named components.

A reward function takes the decoded completions and the ground-truth answers of the same rows (equal
lengths; a GRPO group repeats its prompt's answer K times) and returns one float per row, usually 0.0 or
1.0, or a mapping of named components, each with one float per row (``{"correct": [...], "format": [...]}``): the
reward is then their sum weighted by ``model.reward.component_weights`` (TRL's ``reward_weights``), the ``gdpo``
estimator normalises each component on its own and the dashboard shows each (``train/reward_component/<name>``).
Reward functions run in the training process, possibly outside the main thread, so none may rely on
process-wide signal handlers.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor

from lit_entropy.agents.scoring import score_trajectories
from lit_entropy.rollout.base import RolloutBatch

__all__ = [
    "RewardFunction",
    "RewardFunctionError",
    "RewardScores",
    "check_equal_lengths",
    "check_rewards",
    "compute_reward_scores",
    "compute_rewards",
    "score_responses",
    "score_rollout",
]


@runtime_checkable
class RewardFunction(Protocol):
    """Batched reward: ``fn(completions, answers)`` returns ``len(completions)`` floats.

    Args:
        completions: Decoded completion text (without the prompt), one per row.
        answers: Ground-truth answer of each row, same length as ``completions``.
    """

    def __call__(self, completions: list[str], answers: list[str]) -> list[float]: ...


def check_equal_lengths(completions: Sequence[str], answers: Sequence[str]) -> None:
    """Refuse completions and answers of different lengths (a built-in reward's own input check)."""
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

"""Scoring multi-turn rows: the reward function reads each trajectory's last policy turn (its answer) and may take
the conversations and the environments as keyword arguments; the environment's reward adds."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lit_entropy.rollout.trajectories import Trajectories

__all__ = ["TrajectoryRewardCall", "accepted_kwargs", "last_reply", "score_trajectories"]


def last_reply(conversation: list[dict[str, Any]]) -> str:
    """The content of the last ``assistant`` message of a conversation ("" without one).

    >>> last_reply([{"role": "assistant", "content": "a"}, {"role": "tool", "content": "1"},
    ...             {"role": "assistant", "content": "b"}])
    'b'
    """
    return next((m["content"] for m in reversed(conversation) if m["role"] == "assistant"), "")


def accepted_kwargs(fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The entries of ``kwargs`` that ``fn`` takes: by name, or all of them with ``**kwargs``.

    >>> accepted_kwargs(lambda completions, answers, environments: None, {"environments": 1, "conversations": 2})
    {'environments': 1}
    """
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # builtins without a signature take none
        return {}
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


class TrajectoryRewardCall:
    """``fn(completions, answers)`` with the rows' ``conversations`` / ``environments`` added where ``fn`` takes them.

    A call on a sub-list of the completions (the retry that names the item a batch call failed on) gets the keyword
    entries of the rows whose completion objects it was given.
    """

    def __init__(self, fn: Callable[..., Any], completions: Sequence[str], records: Trajectories) -> None:
        self.fn, self.completions = fn, list(completions)
        self.kwargs = accepted_kwargs(
            fn, {"conversations": records.conversations, "environments": records.environments}
        )

    def __call__(self, completions: list[str], answers: list[str]) -> Any:
        kwargs = self.kwargs
        if len(completions) != len(self.completions):
            rows = [next(i for i, c in enumerate(self.completions) if c is item) for item in completions]
            kwargs = {name: [values[i] for i in rows] for name, values in kwargs.items()}
        return self.fn(completions, answers, **kwargs)


def score_trajectories(
    compute: Callable[..., Any],
    fn: Callable[..., Any],
    fn_name: str,
    records: Trajectories,
    answers: list[str],
    num_samples: int,
    weights: Mapping[str, float] | None = None,
) -> tuple[Any, list[str]]:
    """:func:`~lit_entropy.rewards.score_rollout` of multi-turn rows: ``(RewardScores, completions)``, each row's
    environment reward added to its reward (``compute``: :func:`~lit_entropy.rewards.compute_reward_scores`)."""
    completions = [last_reply(conversation) for conversation in records.conversations]
    rows = [a for a in answers for _ in range(num_samples)]
    call = TrajectoryRewardCall(fn, completions, records)
    scores = compute(call, completions, rows, fn_name=fn_name, group_size=num_samples, weights=weights)
    return type(scores)(scores.rewards + records.environment_rewards.to(scores.rewards), scores.components), completions

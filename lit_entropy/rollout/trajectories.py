"""Per-row records of multi-turn trajectories: turns, tool calls, tool errors, stop reason, environment reward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

__all__ = ["STOP_REASONS", "Trajectories"]

#: The ``[N]`` tensor fields of :class:`Trajectories`.
_TENSORS = ("turns", "tool_calls", "tool_errors", "stop_reasons", "environment_rewards")

STOP_REASONS: tuple[str, ...] = ("eos", "max_turns", "length", "done")
"""Why a trajectory ended: the policy answered without a tool call (``eos``),
``model.sampling.multi_turn.max_turns`` was reached, the token budget ran out (``length``: truncated, never scored as
finished under ``mask_truncated``), the text environment said ``done``."""


@dataclass
class Trajectories:
    """What each row's trajectory did, ``[N]`` per field (rows as in the rollout batch).

    Attributes:
        turns: policy turns.
        tool_calls: tool calls written.
        tool_errors: tool calls that failed (unreadable, unknown tool, bad arguments, raised, over the per-turn limit).
        stop_reasons: index into :data:`STOP_REASONS`.
        environment_rewards: float32, the environment's reward (a text environment's summed ``step`` rewards, a tool
            environment's ``get_reward()``), added to the reward function's.
        conversations: each row's messages after the prompt (``assistant``, ``tool``, ``user``), as decoded text.
        environments: each row's environment instance (None for tools only), for reward functions.
        turn_rewards: under ``model.sampling.multi_turn.reward_placement: per_turn``, each row's text-environment
            rewards as ``(response column of the turn's last policy token, reward)``; None otherwise (all on the last
            token).
    """

    turns: Tensor
    tool_calls: Tensor
    tool_errors: Tensor
    stop_reasons: Tensor
    environment_rewards: Tensor
    conversations: list[list[dict[str, Any]]]
    environments: list[Any]
    turn_rewards: list[list[tuple[int, float]]] | None = None

    def select(self, index: Tensor | slice) -> Trajectories:
        """The rows ``index``."""
        rows = range(len(self.conversations))[index] if isinstance(index, slice) else index.tolist()
        return Trajectories(
            turns=self.turns[index], tool_calls=self.tool_calls[index], tool_errors=self.tool_errors[index],
            stop_reasons=self.stop_reasons[index], environment_rewards=self.environment_rewards[index],
            conversations=[self.conversations[i] for i in rows], environments=[self.environments[i] for i in rows],
            turn_rewards=None if self.turn_rewards is None else [self.turn_rewards[i] for i in rows],
        )  # fmt: skip

    @classmethod
    def cat(cls, parts: Sequence[Trajectories]) -> Trajectories:
        """The rows of ``parts`` in order."""
        tensors = {name: torch.cat([getattr(p, name) for p in parts]) for name in _TENSORS}
        conversations = [c for p in parts for c in p.conversations]
        placed = None
        if all(p.turn_rewards is not None for p in parts):
            placed = [r for p in parts for r in p.turn_rewards or []]
        environments = [e for p in parts for e in p.environments]
        return cls(**tensors, conversations=conversations, environments=environments, turn_rewards=placed)

    def placed_rewards(self, width: int, device: torch.device | str = "cpu") -> Tensor | None:
        """``[N, width]`` float32: each row's per-turn rewards at their turns' last policy tokens, 0 elsewhere;
        None without per-turn placement.

        >>> rows = Trajectories(*(torch.zeros(2),) * 5, [[], []], [None, None], turn_rewards=[[(1, -0.5)], []])
        >>> rows.placed_rewards(3)
        tensor([[ 0.0000, -0.5000,  0.0000],
                [ 0.0000,  0.0000,  0.0000]])
        """
        if self.turn_rewards is None:
            return None
        out = torch.zeros(len(self.turn_rewards), width, dtype=torch.float32)
        for row, placed in enumerate(self.turn_rewards):
            for column, reward in placed:
                out[row, column] += reward
        return out.to(device)

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (``torch.load(weights_only=True)`` reads it): the tensors on the CPU, the
        conversations and per-turn rewards; not the environment instances (user objects, used only when scoring)."""
        state: dict[str, Any] = {name: getattr(self, name).cpu() for name in _TENSORS}
        state.update(conversations=self.conversations, turn_rewards=self.turn_rewards)
        return state

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> Trajectories:
        """The records :meth:`state_dict` described (``environments`` all None)."""
        tensors = {name: state[name] for name in _TENSORS}
        conversations = state["conversations"]
        return cls(**tensors, conversations=conversations, environments=[None] * len(conversations),
                   turn_rewards=state["turn_rewards"])  # fmt: skip

    def stopped(self, reason: str) -> Tensor:
        """``[N]`` bool: the rows that ended for ``reason``."""
        return self.stop_reasons == STOP_REASONS.index(reason)

    @property
    def truncated(self) -> Tensor:
        """``[N]`` bool: the rows whose token budget ran out (stop reason ``length``)."""
        return self.stopped("length")

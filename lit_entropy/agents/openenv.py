"""An OpenEnv environment (``openenv-core``, the ``openenv`` extra) as a text environment for multi-turn rollouts.

OpenEnv environments speak typed pydantic messages: ``reset(seed=..., episode_id=..., **kwargs) -> Observation`` and
``step(action: Action) -> Observation``, where an observation carries ``done``, ``reward`` and the environment's own
fields. A client (``SyncEnvClient`` over a server) answers the same calls with a ``StepResult(observation, reward,
done)``. :class:`OpenEnvTextEnvironment` turns either into the gym-like text environment that
``model.sampling.multi_turn.environment`` takes: the policy's turn becomes one field of the environment's action
class, one field of each observation becomes the next user message, and the step's reward and ``done`` are the
turn's.

Nothing here imports ``openenv``: the environment, its client and its action class are named by import path, so the
adapter works with any object of that shape.
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from lit_entropy.extensions import import_object

__all__ = ["OpenEnvTextEnvironment"]

_SETTING = "model.sampling.multi_turn.environment.init_args"
#: Fields every OpenEnv observation has; the rest is the environment's own content.
_BOOKKEEPING = frozenset({"done", "reward", "metadata"})


class OpenEnvTextEnvironment:
    """One trajectory's OpenEnv environment behind ``reset(row)`` / ``step(text)``.

    Args:
        env: import path of the OpenEnv environment class (an ``openenv.core.Environment``, run in this process) or
            of a client class whose ``reset`` / ``step`` return ``StepResult``; a fresh instance per trajectory.
        action: import path of the environment's ``Action`` class; the policy's text goes into ``action_field``.
        action_field: the action field that holds the policy's text (the echo template's ``message``).
        observation_field: the observation field that becomes the next user message; None = the observation's own
            fields (all but ``done``, ``reward``, ``metadata``) as JSON, or its only one as text.
        env_args: keyword arguments of the environment class.
        reset_fields: dataset-row keys passed to ``reset`` as keyword arguments (e.g. ``seed``); none by default.
    """

    def __init__(
        self,
        env: str,
        action: str,
        action_field: str = "message",
        observation_field: str | None = None,
        env_args: Mapping[str, Any] | None = None,
        reset_fields: Sequence[str] = (),
    ) -> None:
        self.env = import_object(env, f"{_SETTING}.env")(**dict(env_args or {}))
        for name in ("reset", "step"):
            if not callable(getattr(self.env, name, None)):
                raise TypeError(f"{_SETTING}.env: {env!r} has no {name}(); expected an OpenEnv environment or client")
        self.action_class = import_object(action, f"{_SETTING}.action")
        self.action_field, self.observation_field = action_field, observation_field
        self.reset_fields = tuple(reset_fields)

    def reset(self, row: Mapping[str, Any]) -> str | None:
        """Reset for the dataset ``row``; the first observation's text is the first user message (None if empty)."""
        missing = [key for key in self.reset_fields if key not in row]
        if missing:
            raise KeyError(f"{_SETTING}.reset_fields: the dataset row has no {missing} (it has {sorted(row)})")
        observation, _, _ = self._unpack(self.env.reset(**{key: row[key] for key in self.reset_fields}))
        return self._text(observation) or None

    def step(self, text: str) -> tuple[str, float, bool]:
        """The policy's turn as an action; ``(next user message, reward, done)``."""
        observation, reward, done = self._unpack(self.env.step(self.action_class(**{self.action_field: text})))
        return ("" if done else self._text(observation)), reward, done

    def _unpack(self, result: Any) -> tuple[Any, float, bool]:
        """``(observation, reward, done)`` of an ``Observation`` (environment) or a ``StepResult`` (client); a None
        reward is 0, a bool one 0 / 1."""
        observation = getattr(result, "observation", result)
        reward = getattr(result, "reward", None)
        reward = getattr(observation, "reward", None) if reward is None else reward
        done = bool(getattr(result, "done", False) or getattr(observation, "done", False))
        value = 0.0 if reward is None else reward
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TypeError(f"{_SETTING}.env: the environment returned the reward {reward!r}; expected a finite number")
        return observation, float(value), done

    def _text(self, observation: Any) -> str:
        """The observation's ``observation_field`` as text, or its own fields (JSON when several)."""
        fields = observation.model_dump() if hasattr(observation, "model_dump") else dict(vars(observation))
        if self.observation_field is not None:
            if self.observation_field not in fields:
                raise KeyError(
                    f"{_SETTING}.observation_field: {self.observation_field!r} is not a field of "
                    f"{type(observation).__name__} (it has {sorted(fields)})"
                )
            value = fields[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value, default=str)
        own = {k: v for k, v in fields.items() if k not in _BOOKKEEPING}
        if len(own) == 1 and isinstance(next(iter(own.values())), str):
            return str(next(iter(own.values())))
        return json.dumps(own, default=str) if own else ""

"""The two environment shapes, one instance per trajectory, behind one session interface.

- A **tool environment** (TRL's ``environment_factory`` duck type): ``reset(**row)`` may return a first message
  (appended to the prompt as a user message); its public methods are the tools the policy calls; an optional
  ``get_reward()`` gives the trajectory's environment reward when it ends.
- A **text environment** (gym-like, any class with ``step``): ``reset(row) -> observation`` (the first message, or
  None), ``step(text) -> (observation, reward, done)`` after every policy turn, for games and feedback loops
  without tool calls; the observation is the next user message, the rewards add up.

``row`` is the dataset row of the trajectory's prompt: ``prompt`` (rendered), ``answer`` (and ``class``).
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lit_entropy.agents.config import MultiTurnConfig
from lit_entropy.agents.parsers import ToolParser, resolve_tool_parser
from lit_entropy.agents.tools import ToolResult, call_tool, environment_tools, load_tools, tool_schemas
from lit_entropy.extensions import import_object

__all__ = ["EnvironmentSession", "Environments", "TurnOutcome"]

_SETTING = "model.sampling.multi_turn.environment"


@dataclass
class TurnOutcome:
    """What the environment made of one policy turn.

    Attributes:
        messages: messages to append (tool results, an observation); empty when the trajectory ends.
        stop: the stop reason when the trajectory ends here (``eos``, ``max_turns``, ``done``), else None.
        tool_calls: calls written in the turn; ``tool_errors`` of them failed.
        reward: the environment's reward for this turn (a text environment's ``step``), 0 otherwise.
    """

    messages: list[dict[str, Any]] = field(default_factory=list)
    stop: str | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    reward: float = 0.0


class Environments:
    """``model.sampling.multi_turn``'s environment class, tools and tool parser, resolved (import errors name the
    setting).

    Args:
        config: the settings.
    """

    def __init__(self, config: MultiTurnConfig) -> None:
        self.config = config
        self.factory = _environment_factory(config.environment)
        self.text = self.factory is not None and callable(getattr(self.factory.func, "step", None))
        self.tools = load_tools(config.tools)
        self.parser: ToolParser = resolve_tool_parser(config.tool_parser)
        if self.text and self.tools:
            raise ValueError(
                f"{_SETTING} is a text environment (it has step) and model.sampling.multi_turn.tools is set: a text "
                "environment takes no tool calls; drop the tools or use a tool environment"
            )

    def schemas(self) -> list[dict[str, Any]] | None:
        """The JSON schemas of every tool (a probe instance of a tool environment gives its methods'); None for a
        text environment."""
        if self.text:
            return None
        tools = dict(self.tools)
        if self.factory is not None:
            tools.update(environment_tools(self.factory()))
        return tool_schemas(tools)

    def session(self) -> EnvironmentSession:
        """A fresh environment instance for one trajectory."""
        return EnvironmentSession(self, None if self.factory is None else self.factory())


class EnvironmentSession:
    """One trajectory's environment: :meth:`start`, then :meth:`respond` after each policy turn, then
    :meth:`final_reward`.

    Attributes:
        environment: the instance (None for tools only); reward functions receive it (``environments``).
    """

    def __init__(self, owner: Environments, environment: Any) -> None:
        self.owner = owner
        self.environment = environment
        self.tools: dict[str, Callable[..., Any]] = dict(owner.tools)
        if environment is not None and not owner.text:
            self.tools.update(environment_tools(environment))

    def start(self, row: Mapping[str, Any]) -> str | None:
        """Reset the environment for the dataset ``row``; its first message, or None."""
        if self.environment is None or not callable(getattr(self.environment, "reset", None)):
            return None
        first = self.environment.reset(dict(row)) if self.owner.text else self.environment.reset(**row)
        if first is not None and not isinstance(first, str):
            raise TypeError(f"{_SETTING}: reset returned {type(first).__name__}, expected a message string or None")
        return first or None

    def respond(self, text: str, last_turn: bool) -> TurnOutcome:
        """The environment's answer to a policy turn (``text``, ended by EOS); ``last_turn``: no turn may follow."""
        if self.owner.text:
            return self._step(text, last_turn)
        calls = self.owner.parser(text)
        if not calls:
            return TurnOutcome(stop="eos")
        if last_turn:
            return TurnOutcome(stop="max_turns", tool_calls=len(calls))
        limit = self.owner.config.max_tool_calls_per_turn
        results = [call_tool(self.tools, call) for call in calls[:limit]]
        results += [
            ToolResult(f"Error: more than {limit} tool calls in one turn; this one was not run", True)
            for _ in calls[limit:]
        ]
        messages = [
            {"role": "tool", "name": call.name, "content": result.content}
            for call, result in zip(calls, results, strict=True)
        ]
        errors = sum(result.is_error for result in results)
        return TurnOutcome(messages=messages, tool_calls=len(calls), tool_errors=errors)

    def _step(self, text: str, last_turn: bool) -> TurnOutcome:
        out = self.environment.step(text)
        if not isinstance(out, tuple) or len(out) != 3:
            raise TypeError(f"{_SETTING}: step must return (observation, reward, done), got {out!r}")
        observation, reward, done = out
        if not isinstance(reward, numbers.Real) or not math.isfinite(float(reward)):
            raise TypeError(f"{_SETTING}: step returned the reward {reward!r}; it must be a finite number")
        if done:
            return TurnOutcome(stop="done", reward=float(reward))
        if last_turn:
            return TurnOutcome(stop="max_turns", reward=float(reward))
        if not isinstance(observation, str):
            raise TypeError(f"{_SETTING}: step returned the observation {observation!r}; it must be a string")
        return TurnOutcome(messages=[{"role": "user", "content": observation}], reward=float(reward))

    def final_reward(self) -> float:
        """A tool environment's ``get_reward()`` (0 without one); a text environment's rewards came per turn."""
        get = getattr(self.environment, "get_reward", None)
        if self.owner.text or not callable(get):
            return 0.0
        value = get()
        if not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
            raise TypeError(f"{_SETTING}: get_reward returned {value!r}; it must be a finite number")
        return float(value)


def _environment_factory(spec: str | Mapping[str, Any] | None) -> functools.partial[Any] | None:
    """``functools.partial(cls, **init_args)``: a zero-argument callable that makes a fresh environment, or None."""
    if spec is None:
        return None
    path = spec if isinstance(spec, str) else spec["class_path"]
    init_args = {} if isinstance(spec, str) else dict(spec.get("init_args") or {})
    cls = import_object(path, _SETTING)
    if not isinstance(cls, type):
        raise ValueError(f"{_SETTING}: {path!r} resolves to a {type(cls).__name__}, not a class")
    return functools.partial(cls, **init_args)

"""``model.sampling.multi_turn``: multi-turn and tool-calling rollouts (null = one completion per prompt)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from lit_entropy.functional.checks import check_number

__all__ = ["REWARD_PLACEMENTS", "MultiTurnConfig"]

#: Values of ``model.sampling.multi_turn.reward_placement``.
REWARD_PLACEMENTS: tuple[str, ...] = ("last_token", "per_turn")


@dataclass(frozen=True)
class MultiTurnConfig:
    """How a trajectory alternates between the policy and an environment (``model.sampling.multi_turn``).

    One trajectory per sampled row: the policy writes a turn (ended by EOS), the environment answers (tool results,
    or a text environment's observation), and so on, within one token budget, ``model.sampling.max_new_tokens``,
    over the whole trajectory (policy and environment tokens). Environment tokens are context only: loss mask 0,
    out of every statistic (docs/agents.md).
    """

    environment: str | dict[str, Any] | None = None
    """The environment class, a fresh instance per trajectory: ``pkg.module:Class``, or ``{class_path: pkg.module.Class,
    init_args: {...}}`` as Lightning writes classes.
    A class with ``step`` is a text environment (``reset(row) -> observation``, ``step(text) -> (observation,
    reward, done)``); any other is a tool environment (``reset(**row)`` may return a first message, its public
    methods are tools, optional ``get_reward()``). Null: only ``tools``."""
    tools: list[str] | None = None
    """Stateless tools besides the environment's methods: ``pkg.module:function`` each (typed, with a Google-style
    docstring: ``transformers.utils.get_json_schema`` turns it into the schema the chat template renders)."""
    max_turns: int = 4
    """Policy turns per trajectory at most (stop reason ``max_turns``)."""
    max_tool_calls_per_turn: int = 4
    """Tool calls executed per policy turn; further calls are answered with an error."""
    max_tool_response_tokens: int = 256
    """A tool result longer than this many tokens is cut there and marked ``...(truncated)``."""
    tool_parser: str = "hermes"
    """How tool calls are read from a policy turn: ``hermes`` (``<tool_call>{"name", "arguments"}</tool_call>``)
    or a name registered with `lit_entropy.agents.register_tool_parser`, or an import path ``pkg.module:fn``."""
    chat_template: str | None = None
    """A Jinja chat template that replaces the tokenizer's for the environment messages; null = the tokenizer's
    own; a tokenizer without one renders environment messages as plain text (docs/agents.md)."""

    reward_placement: str = "last_token"
    """Where a text environment's per-turn rewards (``step``'s) sit among the trajectory's tokens: ``last_token``
    adds them up with the reward function's score on the trajectory's last policy token; ``per_turn`` puts each on
    the last policy token of its own turn (the rest stays on the last token). Estimators that read token rewards
    (``gae``, ``reinforce_plus_plus``) then credit each turn with its own reward; those that score a row by its sum
    (``grpo``, ``rloo``, ...) see the same sum either way."""

    def __post_init__(self) -> None:
        prefix = "model.sampling.multi_turn."
        if self.reward_placement not in REWARD_PLACEMENTS:
            raise ValueError(
                f"{prefix}reward_placement must be one of {REWARD_PLACEMENTS}, got {self.reward_placement!r}"
            )
        check_number(f"{prefix}max_turns", self.max_turns, low=1, integer=True)
        check_number(f"{prefix}max_tool_calls_per_turn", self.max_tool_calls_per_turn, low=1, integer=True)
        check_number(f"{prefix}max_tool_response_tokens", self.max_tool_response_tokens, low=1, integer=True)
        env = self.environment
        if env is not None and not isinstance(env, str):
            if not isinstance(env, Mapping) or not isinstance(env.get("class_path"), str):
                raise ValueError(
                    f"{prefix}environment must be 'pkg.module:Class' or {{class_path, init_args}}, got {env!r}"
                )
            if not isinstance(env.get("init_args") or {}, Mapping):
                raise ValueError(f"{prefix}environment: init_args must be a dict, got {env!r}")
            extra = {k: v for k, v in env.items() if k not in ("class_path", "init_args")}
            if extra:  # `--...environment.init_args.k=v` reaches a dict setting as `k` beside class_path
                init_args = {**(env.get("init_args") or {}), **extra}
                object.__setattr__(self, "environment", {"class_path": env["class_path"], "init_args": init_args})
        if self.tools is not None and (
            isinstance(self.tools, str) or not all(isinstance(t, str) and t for t in self.tools)
        ):
            raise ValueError(f"{prefix}tools must be a list of 'pkg.module:function' strings, got {self.tools!r}")
        if env is None and not self.tools:
            raise ValueError(f"{prefix}environment and {prefix}tools are both empty: set an environment or tools")
        if not isinstance(self.tool_parser, str) or not self.tool_parser:
            raise ValueError(f"{prefix}tool_parser must be a parser name or an import path, got {self.tool_parser!r}")
        if self.chat_template is not None and (not isinstance(self.chat_template, str) or not self.chat_template):
            raise ValueError(
                f"{prefix}chat_template must be a Jinja template string or null, got {self.chat_template!r}"
            )

"""Tool-call parsers: the tool calls written in one policy turn, by name (``model.sampling.multi_turn.tool_parser``).

A parser takes the decoded text of a turn and returns its :class:`ToolCall`\\ s in order; a call it cannot read
(bad JSON, no name) is a :class:`ToolCall` with ``error`` set, so it is answered and counted as a tool error
instead of silently dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from lit_entropy.extensions import import_object

__all__ = ["TOOL_PARSERS", "ToolCall", "ToolParser", "hermes_tool_calls", "register_tool_parser", "resolve_tool_parser"]


@dataclass(frozen=True)
class ToolCall:
    """One tool call of a policy turn.

    Attributes:
        name: the tool's name ("" when unreadable).
        arguments: keyword arguments of the call.
        error: why the call could not be read, or None.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


ToolParser = Callable[[str], list[ToolCall]]
"""``parser(turn_text) -> tool calls`` in the order written."""

_HERMES = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def hermes_tool_calls(text: str) -> list[ToolCall]:
    """Hermes-style calls: ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` (Qwen2.5, Hermes, TRL).

    >>> hermes_tool_calls('x <tool_call>{"name": "add", "arguments": {"a": 1}}</tool_call>')
    [ToolCall(name='add', arguments={'a': 1}, error=None)]
    >>> hermes_tool_calls("<tool_call>{oops</tool_call>")[0].error
    'invalid JSON in <tool_call>: {oops'
    """
    calls = []
    for body in _HERMES.findall(text):
        try:
            payload = json.loads(body)
        except json.JSONDecodeError:
            calls.append(ToolCall("", error=f"invalid JSON in <tool_call>: {body.strip()[:200]}"))
            continue
        if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
            calls.append(
                ToolCall("", error=f'a tool call needs {{"name": str, "arguments": dict}}, got {body.strip()[:200]}')
            )
            continue
        arguments = payload.get("arguments", {})
        if isinstance(arguments, str):  # some models write the arguments as a JSON string
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass
        if not isinstance(arguments, dict):
            calls.append(ToolCall(payload["name"], error=f"the arguments of {payload['name']!r} are not an object"))
            continue
        calls.append(ToolCall(payload["name"], arguments))
    return calls


TOOL_PARSERS: dict[str, ToolParser] = {"hermes": hermes_tool_calls}
"""The built-in and registered tool-call parsers by name."""


def register_tool_parser(name: str, parser: ToolParser) -> None:
    """Make ``parser`` available as ``model.sampling.multi_turn.tool_parser: <name>`` (a name taken already is
    refused)."""
    if name in TOOL_PARSERS and TOOL_PARSERS[name] is not parser:
        raise ValueError(f"a tool parser named {name!r} is registered already")
    TOOL_PARSERS[name] = parser


def resolve_tool_parser(spec: str, setting: str = "model.sampling.multi_turn.tool_parser") -> ToolParser:
    """The parser a setting names: a registered name or an import path ``pkg.module:function``."""
    if spec in TOOL_PARSERS:
        return TOOL_PARSERS[spec]
    if ":" not in spec and "." not in spec:
        raise ValueError(f"{setting}: expected one of {sorted(TOOL_PARSERS)} or 'pkg.module:function', got {spec!r}")
    parser = import_object(spec, setting)
    if not callable(parser):
        raise ValueError(f"{setting}: resolves to a {type(parser).__name__}, which is not callable, got {spec!r}")
    return parser

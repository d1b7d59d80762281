"""Tools: typed Python callables with docstrings, their JSON schemas, and calling them for a policy turn.

A tool is a function (``model.sampling.multi_turn.tools``) or a public method of a tool environment. Its schema is
``transformers.utils.get_json_schema`` of it (type hints + Google-style docstring), the form chat templates render
with ``apply_chat_template(tools=...)``. A call runs on the training process; whatever it raises becomes an error
message the policy reads (and a tool error in ``train/multi_turn/tool_error_rate``), never a crashed run.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from lit_entropy.agents.parsers import ToolCall
from lit_entropy.extensions import import_object

__all__ = ["TRUNCATION_MARKER", "ToolResult", "call_tool", "environment_tools", "load_tools", "tool_schemas"]

#: Appended to a tool result cut at ``model.sampling.multi_turn.max_tool_response_tokens``.
TRUNCATION_MARKER = "...(truncated)"

#: Methods of a tool environment that are its protocol, not tools.
PROTOCOL_METHODS = frozenset({"reset", "get_reward", "close"})


class ToolResult(NamedTuple):
    """What one call gave the policy to read: ``content``, and whether it is an error."""

    content: str
    is_error: bool


def load_tools(
    specs: list[str] | None, setting: str = "model.sampling.multi_turn.tools"
) -> dict[str, Callable[..., Any]]:
    """``{name: function}`` of the import paths ``specs`` (each ``pkg.module:function``), checked to be callable with
    distinct names."""
    tools: dict[str, Callable[..., Any]] = {}
    for spec in specs or []:
        fn = import_object(spec, setting)
        if not callable(fn):
            raise ValueError(f"{setting}: {spec!r} resolves to a {type(fn).__name__}, which is not callable")
        name = getattr(fn, "__name__", spec)
        if name in tools:
            raise ValueError(f"{setting}: two tools are named {name!r}, got {specs!r}")
        tools[name] = fn
    return tools


def environment_tools(environment: Any) -> dict[str, Callable[..., Any]]:
    """The public methods of a tool environment (TRL's ``environment_factory`` rule): every callable attribute whose
    name does not start with ``_``, less ``reset`` / ``get_reward`` / ``close``."""
    out = {}
    for name in dir(type(environment)):
        if name.startswith("_") or name in PROTOCOL_METHODS:
            continue
        if callable(getattr(type(environment), name, None)):
            out[name] = getattr(environment, name)
    return out


def tool_schemas(
    tools: Mapping[str, Callable[..., Any]], setting: str = "model.sampling.multi_turn"
) -> list[dict[str, Any]]:
    """The JSON schema of each tool (``transformers.utils.get_json_schema``); a tool without type hints or docstring
    is refused naming it."""
    from transformers.utils import get_json_schema  # noqa: PLC0415 - reason: transformers only where tools are used

    schemas = []
    for name, fn in tools.items():
        try:
            schemas.append(get_json_schema(fn))
        except Exception as err:  # transformers' DocstringParsingException / TypeHintParsingException
            raise ValueError(
                f"{setting}: tool {name!r} needs type hints and a Google-style docstring with an Args section "
                f"(transformers.utils.get_json_schema: {err})"
            ) from err
    return schemas


def call_tool(tools: Mapping[str, Callable[..., Any]], call: ToolCall) -> ToolResult:
    """Run one parsed call; an unreadable call, an unknown tool, bad arguments or an exception give an error result."""
    if call.error is not None:
        return ToolResult(f"Error: {call.error}", True)
    fn = tools.get(call.name)
    if fn is None:
        return ToolResult(f"Error: unknown tool {call.name!r}; the tools are {sorted(tools)}", True)
    try:
        inspect.signature(fn).bind(**call.arguments)
    except TypeError as err:
        return ToolResult(f"Error: bad arguments for {call.name}: {err}", True)
    try:
        value = fn(**call.arguments)
    except Exception as err:  # a user's tool: whatever it raises is the policy's to read
        return ToolResult(f"Error: {call.name} raised {type(err).__name__}: {err}", True)
    return ToolResult(value if isinstance(value, str) else str(value), False)

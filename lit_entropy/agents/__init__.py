"""Multi-turn and tool-calling rollouts (``model.sampling.multi_turn``): environments, tools, tool-call parsers, and the
rollout loop that keeps environment tokens out of the loss and out of every statistic (docs/agents.md)."""

from lit_entropy.agents.config import MultiTurnConfig
from lit_entropy.agents.environments import Environments, EnvironmentSession, TurnOutcome
from lit_entropy.agents.openenv import OpenEnvTextEnvironment
from lit_entropy.agents.parsers import TOOL_PARSERS, ToolCall, hermes_tool_calls, register_tool_parser
from lit_entropy.agents.rollout import MultiTurnRollout
from lit_entropy.agents.template import ConversationRenderer, TemplateRewritesTurns
from lit_entropy.agents.tools import TRUNCATION_MARKER, call_tool, tool_schemas

__all__ = [
    "TOOL_PARSERS",
    "TRUNCATION_MARKER",
    "ConversationRenderer",
    "EnvironmentSession",
    "Environments",
    "MultiTurnConfig",
    "MultiTurnRollout",
    "OpenEnvTextEnvironment",
    "TemplateRewritesTurns",
    "ToolCall",
    "TurnOutcome",
    "call_tool",
    "hermes_tool_calls",
    "register_tool_parser",
    "tool_schemas",
]

"""Rendering rows to text: prompts (``prompt_template``, chat messages, the tokenizer's chat template) and
ground-truth answers (numbers become strings).

The rules, as :class:`~lit_entropy.data.datamodule.PromptDataModule` documents them:

* a string prompt first goes through ``prompt_template`` (every ``{prompt}`` is replaced by the prompt;
  other braces are kept verbatim, so ``\\boxed{}`` needs no escaping). Message lists are not templated.
* with the chat template, a string becomes one user message and ``system_prompt`` is prepended as a system
  message (a row that already has one is an error); the template renders with ``add_generation_prompt``.
* without it, a message list is an error naming the prompt setting.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["PromptRenderer", "answer_text", "is_message", "short"]

# Characters of a value quoted in error messages.
_SNIPPET = 80


def short(value: Any) -> str:
    """``repr(value)`` cut to a snippet for error messages."""
    text = repr(value)
    return text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "..."


def is_message(value: Any) -> bool:
    """Whether ``value`` is a chat message ``{"role": str, "content": str, ...}``."""
    return isinstance(value, Mapping) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)


def answer_text(value: Any, setting: str, key: str, row: int, where: str) -> str:
    """The ground-truth answer of one row as text: strings as they are, ints in decimal, integral floats
    without ``.0`` (csv/parquet readers turn integer columns with a float or a gap into float64)."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else str(value)
    raise ValueError(f"{setting}={key!r}: row {row} of {where} holds {short(value)}, not a string or number")


@dataclass(frozen=True)
class PromptRenderer:
    """Renders one row's prompt value (a string or a list of chat messages) to the text the model reads.

    Attributes:
        tokenizer: Renders chat messages (``apply_chat_template``); unused without the chat template.
        apply_chat_template: Render with the tokenizer's chat template.
        prompt_template: Format of string prompts containing ``{prompt}``; None leaves them as they are.
        system_prompt: System message prepended with the chat template; None for none.
        chat_template_kwargs: Extra variables for the chat template.
    """

    tokenizer: Any
    apply_chat_template: bool = False
    prompt_template: str | None = None
    system_prompt: str | None = None
    chat_template_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def render(self, value: Any, setting: str, key: str, row: int, where: str) -> str:
        """Prompt text of row ``row`` of ``where``, read from field ``setting=key``."""
        if isinstance(value, str):
            text = self.prompt_template.replace("{prompt}", value) if self.prompt_template is not None else value
            if not self.apply_chat_template:
                return text
            messages = [{"role": "user", "content": text}]
        elif isinstance(value, Sequence) and value and all(is_message(m) for m in value):
            if not self.apply_chat_template:
                raise ValueError(
                    f"{setting}={key!r} holds chat messages (row {row} of {where}) but apply_chat_template=False; "
                    f"set apply_chat_template=True or point {setting} at the text (e.g. '{key}.0.content')"
                )
            messages = [{"role": m["role"], "content": m["content"]} for m in value]
        else:
            raise ValueError(
                f"{setting}={key!r}: row {row} of {where} is neither a string nor a list of "
                f"{{'role', 'content'}} messages: {short(value)}"
            )
        return self._chat(messages, row, where)

    def _chat(self, messages: list[dict[str, str]], row: int, where: str) -> str:
        """The chat template's text of ``messages`` with ``system_prompt`` prepended."""
        if self.system_prompt is not None:
            if messages[0]["role"] == "system":
                raise ValueError(
                    f"system_prompt={short(self.system_prompt)} is set but row {row} of {where} already starts with "
                    f"a system message; unset system_prompt"
                )
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        rendered = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        if not isinstance(rendered, str):
            raise ValueError(f"apply_chat_template=True: the chat template returned {type(rendered).__name__}, not str")
        return rendered

"""Environment messages as tokens, appended to the sampled ids without re-tokenizing any earlier turn.

The trainer must see exactly the ids the engine sampled. So a trajectory is never rendered and tokenized as a
whole: the policy's turns stay the sampled ids, and only the *new* environment messages are rendered, as the
chat template's text that appending them adds (verl's and TRL's delta rule). That is exact only when the template
keeps earlier turns as a prefix when a turn is appended; templates that rewrite them (Qwen3's, dropping earlier
``<think>`` blocks) would make the rendered conversation differ from what was trained on. :class:`ConversationRenderer`
checks this once at setup on probe conversations and refuses such a template in one line naming it.

Without any chat template (a base model), environment messages are plain text: a tool result as
``<tool_response>\\n{content}\\n</tool_response>\\n``, any other message as ``{content}\\n``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ConversationRenderer", "TemplateRewritesTurns"]

Message = dict[str, Any]

# Probe conversation of the setup check; the reply holds a <think> block, which templates that strip reasoning from
# earlier turns rewrite.
_QUESTION = {"role": "user", "content": "probe question"}
_REPLY = "<think>probe reasoning</think>probe reply"
_TOOL = {"role": "tool", "name": "probe_tool", "content": "probe result"}
_USER = {"role": "user", "content": "probe observation"}


class TemplateRewritesTurns(ValueError):
    """The chat template does not keep earlier turns as a prefix when a turn is appended (refused at setup)."""


class ConversationRenderer:
    """Renders environment messages to the token ids that follow a policy turn (see the module docstring).

    Args:
        tokenizer: the policy's tokenizer.
        eos_token_ids: ids that end a policy turn.
        chat_template: a template replacing the tokenizer's; None = the tokenizer's own (or plain text without one).
        tools: JSON schemas passed to the template as ``tools`` (rendered into its system part by most templates).

    Raises:
        TemplateRewritesTurns: the template rewrites earlier turns (one line naming it).
    """

    def __init__(
        self,
        tokenizer: Any,
        eos_token_ids: Sequence[int],
        chat_template: str | None = None,
        tools: list[dict[str, Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = chat_template or getattr(tokenizer, "chat_template", None) or None
        self.name = (
            "model.sampling.multi_turn.chat_template"
            if chat_template
            else f"the chat template of {getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__}"
        )
        self.tools = tools or None
        self.eos_texts = [tokenizer.decode([i]) for i in eos_token_ids]
        self.after_eos = ""
        if self.template is not None:
            self._check()

    @property
    def plain(self) -> bool:
        """True without a chat template: messages are plain text."""
        return self.template is None

    def render(self, messages: Sequence[Message], generation_prompt: bool) -> str:
        """The template's text of ``messages``."""
        text = self.tokenizer.apply_chat_template(
            list(messages), chat_template=self.template, tools=self.tools, tokenize=False,
            add_generation_prompt=generation_prompt,
        )  # fmt: skip
        if not isinstance(text, str):
            raise TypeError(f"{self.name} rendered {type(text).__name__}, not str")
        return text

    def _refuse(self, what: str) -> TemplateRewritesTurns:
        return TemplateRewritesTurns(
            f"model.sampling.multi_turn: {self.name} {what}, so the tokens trained on would differ from the sampled "
            "ones; set model.sampling.multi_turn.chat_template to a template that keeps earlier turns as a prefix"
        )

    def _check(self) -> None:
        """Setup check on probe conversations; fills the closing text a policy turn's EOS leaves out."""
        prompt = self.render([_QUESTION], True)
        reply = {"role": "assistant", "content": _REPLY}
        closed = self.render([_QUESTION, reply], False)
        if not closed.startswith(prompt + _REPLY):
            raise self._refuse("does not render a reply right after its generation prompt")
        closing = closed[len(prompt) + len(_REPLY) :]
        eos = next((t for t in self.eos_texts if t and closing.startswith(t)), "")
        self.after_eos = closing[len(eos) :]  # e.g. ChatML's "\n" after <|im_end|>: rendered, not sampled
        for message in (_TOOL, _USER):
            extended = self.render([_QUESTION, reply, message], True)
            if not extended.startswith(closed):
                raise self._refuse(f"rewrites earlier turns when a {message['role']} message is appended")
            again = self.render([_QUESTION, reply, message, {"role": "assistant", "content": "second"}], False)
            if not again.startswith(extended + "second"):
                raise self._refuse(f"rewrites earlier turns when a reply follows a {message['role']} message")
        if not self.render([_QUESTION, _USER], True).startswith(self.render([_QUESTION], False)):
            raise self._refuse("rewrites the prompt when a user message is appended")

    def message_ids(self, messages: Sequence[Message]) -> list[int]:
        """Token ids that follow a policy turn ended by EOS when ``messages`` (tool results or an observation) are
        appended, up to and including the generation prompt of the next turn."""
        if self.plain:
            text = "".join(_plain(m) for m in messages)
        else:
            reply = {"role": "assistant", "content": _REPLY}
            closed = self.render([_QUESTION, reply], False)
            full = self.render([_QUESTION, reply, *messages], True)
            if not full.startswith(closed):
                raise self._refuse(f"rewrites earlier turns when {[m['role'] for m in messages]} messages are appended")
            text = self.after_eos + full[len(closed) :]
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def prompt_with(self, prompt_text: str, message: str) -> tuple[str, bool]:
        """A rendered prompt with a first user message (a tool environment's ``reset``) after it, and whether the
        prompt is chat-rendered (its special tokens are in the text: tokenize without adding any)."""
        if self.plain:
            return prompt_text + message, False
        bare = self.render([_QUESTION], False)
        generation = self.render([_QUESTION], True)[len(bare) :]
        if not prompt_text.endswith(generation):  # the data was not rendered with this template: plain text
            return prompt_text + message, False
        full = self.render([_QUESTION, {"role": "user", "content": message}], True)
        return prompt_text[: len(prompt_text) - len(generation)] + full[len(bare) :], True


def _plain(message: Message) -> str:
    if message["role"] == "tool":
        return f"<tool_response>\n{message['content']}\n</tool_response>\n"
    return f"{message['content']}\n"

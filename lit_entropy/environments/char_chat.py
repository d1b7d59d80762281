"""A character-level chat tokenizer for the tiny agent demonstrations: tool-call tags and a whitespace-free template.

The embedded model's tokenizer (:func:`lit_entropy.data.build_char_tokenizer`) knows digits and ``+-*=`` only,
so it cannot write a Hermes tool call. This one adds the lowercase letters and the JSON punctuation a call
needs, and the four Hermes tags ``<tool_call>``, ``</tool_call>``, ``<tool_response>``, ``</tool_response>`` as
single (non-special) tokens, as Qwen2.5's tokenizer has them: a call costs ~57 tokens instead of ~79, and the
decoded text is the usual Hermes text that ``model.sampling.multi_turn.tool_parser: hermes`` reads.

Its chat template is plain concatenation, so every conversation renders as a prefix of its continuations (what
multi-turn rollouts require of a template): a user or system message is its content, an assistant message its
content then ``<eos>`` (the id the policy samples to end its turn), a tool message
``<tool_response>{content}</tool_response>``; the generation prompt is empty. No whitespace anywhere: the
character vocabulary has none (JSON is written without spaces: ``{"name":"calculate","arguments":{...}}``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CHAR_CHAT_ALPHABET", "CHAR_CHAT_TEMPLATE", "TOOL_TAGS", "build_char_chat_tokenizer"]

#: Characters of prompts, answers, tool calls and feedback: digits, arithmetic, JSON punctuation, a-z.
CHAR_CHAT_ALPHABET = '0123456789+-*/=?.(){}[]":,_abcdefghijklmnopqrstuvwxyz'
#: The Hermes tags, one token each.
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
#: Concatenation: prefix-stable, whitespace-free (see the module docstring). ``tools`` are not rendered: the tiny
#: models learn their one tool by supervision, and a schema would cost hundreds of characters of context.
CHAR_CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'assistant' -%}{{ message['content'] }}{{ eos_token }}"
    "{%- elif message['role'] == 'tool' -%}<tool_response>{{ message['content'] }}</tool_response>"
    "{%- else -%}{{ message['content'] }}"
    "{%- endif -%}"
    "{%- endfor -%}"
)


def build_char_chat_tokenizer(*, model_max_length: int = 192) -> Any:
    """The character tokenizer over :data:`CHAR_CHAT_ALPHABET`, the :data:`TOOL_TAGS` and :data:`CHAR_CHAT_TEMPLATE`.

    Ids: the char tokenizer's (``<pad>`` 0, ``<eos>`` 1, ``<bos>`` 2, ``<unk>`` 3, then the alphabet), then the
    four tags. A character outside the alphabet (a space in a tool's error message) encodes as ``<unk>``.

    Args:
        model_max_length: Longest sequence (prompt + whole trajectory) the model accepts.

    >>> tok = build_char_chat_tokenizer()
    >>> tok.convert_ids_to_tokens(tok("<tool_call>{}</tool_call>")["input_ids"])
    ['<tool_call>', '{', '}', '</tool_call>']
    >>> tok.apply_chat_template([{"role": "user", "content": "2*3="}, {"role": "assistant", "content": "6"}],
    ...                         tokenize=False)
    '2*3=6<eos>'
    """
    # deferred: tokenizers/transformers load only when a tokenizer is built, not when the demos' tasks are imported
    from lit_entropy.data.char_tokenizer import build_char_tokenizer  # noqa: PLC0415 - reason: see above

    tokenizer = build_char_tokenizer(CHAR_CHAT_ALPHABET, model_max_length=model_max_length)
    tokenizer.add_tokens(list(TOOL_TAGS))
    tokenizer.chat_template = CHAR_CHAT_TEMPLATE
    return tokenizer

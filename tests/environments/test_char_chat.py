"""The character chat tokenizer of the agent demonstrations: Hermes tags as single tokens, a prefix-stable template."""

from __future__ import annotations

import json

from lit_entropy.environments.char_chat import CHAR_CHAT_ALPHABET, TOOL_TAGS, build_char_chat_tokenizer

CALL = (
    "<tool_call>"
    + json.dumps({"name": "calculate", "arguments": {"expression": "47*86"}}, separators=(",", ":"))
    + "</tool_call>"
)
CONVERSATION = [
    {"role": "user", "content": "47*86="},
    {"role": "assistant", "content": CALL},
    {"role": "tool", "content": "4042"},
    {"role": "assistant", "content": "4042"},
    {"role": "user", "content": "higher"},
]


def test_every_char_and_tag_is_one_token_and_round_trips() -> None:
    tok = build_char_chat_tokenizer()
    ids = tok(CHAR_CHAT_ALPHABET)["input_ids"]
    assert len(ids) == len(CHAR_CHAT_ALPHABET) and tok.unk_token_id not in ids
    for tag in TOOL_TAGS:
        assert tok.convert_ids_to_tokens(tok(tag)["input_ids"]) == [tag]
    ids = tok(CALL)["input_ids"]
    assert len(ids) == len(CALL) - sum(len(t) - 1 for t in TOOL_TAGS[:2])  # two tags, the rest one char each
    assert tok.decode(ids) == CALL
    assert tok.decode(tok("A b")["input_ids"]) == "<unk><unk>b"  # outside the alphabet: <unk>, never an error


def test_template_is_concatenation_and_every_prefix_renders_as_a_prefix() -> None:
    tok = build_char_chat_tokenizer()
    full = tok.apply_chat_template(CONVERSATION, tokenize=False)
    assert full == "47*86=" + CALL + "<eos><tool_response>4042</tool_response>4042<eos>higher"
    for k in range(1, len(CONVERSATION)):
        head = tok.apply_chat_template(CONVERSATION[:k], tokenize=False)
        assert full.startswith(head)
        assert tok.apply_chat_template(CONVERSATION[:k], tokenize=False, add_generation_prompt=True) == head
    # <eos> in the rendered text is the eos id the policy samples, not five characters
    ids = tok(full)["input_ids"]
    assert ids.count(tok.eos_token_id) == 2

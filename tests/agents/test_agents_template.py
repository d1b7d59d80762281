"""The chat-template check and the environment-message delta: the trainer's ids are the rendered conversation."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.agents import ConversationRenderer, MultiTurnConfig, MultiTurnRollout, TemplateRewritesTurns
from lit_entropy.rollout import SamplingConfig
from tests.agents._agents import REWRITING_TEMPLATE, ScriptedEngine, chat_tokenizer

EOS = 1
CALL = '<tool_call>{"name":"multiply","arguments":{"a":2,"b":3}}</tool_call><eos>'


def _batch(tokenizer, questions, answers):
    prompts = [
        tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True)
        for q in questions
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    width = max(len(i) for i in ids)
    input_ids = torch.tensor([[tokenizer.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    return {"input_ids": input_ids, "attention_mask": mask, "prompts": prompts, "answers": answers}


def test_a_prefix_keeping_template_passes_and_names_the_closing_left_after_eos():
    renderer = ConversationRenderer(chat_tokenizer(), [EOS])
    assert renderer.after_eos == "|"  # rendered after the sampled <eos>, as ChatML's "\n" after <|im_end|>


@pytest.mark.parametrize("given", [True, False], ids=["setting", "tokenizer"])
def test_a_template_that_rewrites_earlier_turns_is_refused_in_one_line_naming_it(given):
    tokenizer = chat_tokenizer(None if given else REWRITING_TEMPLATE)
    tokenizer.name_or_path = "my/qwen3-like"
    with pytest.raises(TemplateRewritesTurns) as error:
        ConversationRenderer(tokenizer, [EOS], chat_template=REWRITING_TEMPLATE if given else None)
    message = str(error.value)
    assert "\n" not in message and "rewrites earlier turns" in message
    assert ("model.sampling.multi_turn.chat_template" if given else "my/qwen3-like") in message


def test_trainer_ids_are_the_sampled_ids_plus_the_rendered_messages_and_the_whole_conversation_rendered():
    """Independent reference: the chat template renders the whole conversation at once, tokenized at once; the
    trajectory's ids (never re-tokenized turn by turn) are exactly its prefix, and the ids under the response mask are
    the engine's replies tokenized on their own."""
    tokenizer = chat_tokenizer()
    rollout = MultiTurnRollout(MultiTurnConfig(environment="tests.agents._agents:Calculator", max_turns=3))
    rollout.bind(tokenizer, [EOS])
    batch = _batch(tokenizer, ["2*3?", "22*3?"], ["6", "66"])
    replies = [[CALL, "x<eos>"], ["6<eos>"]]
    engine = ScriptedEngine(tokenizer, replies)
    out = rollout.generate(engine, None, batch, SamplingConfig(num_samples=1, max_new_tokens=200))
    assert out.trajectories.stop_reasons.tolist() == [0, 0]  # eos, eos
    for row, question in enumerate(["2*3?", "22*3?"]):
        messages = [{"role": "user", "content": question}, *out.trajectories.conversations[row]]
        whole = tokenizer.apply_chat_template(messages, tokenize=False)
        reference = tokenizer(whole, add_special_tokens=False)["input_ids"]
        ids = out.sequences[row][out.attention_mask[row].bool()].tolist()
        assert reference[: len(ids)] == ids and tokenizer.decode(reference[len(ids) :]) == "|"
        sampled = [tokenizer(r[row] if row < len(r) else "", add_special_tokens=False)["input_ids"] for r in replies]
        policy_ids = out.responses[row][out.response_mask[row]].tolist()
        assert policy_ids == [i for turn in sampled[: out.trajectories.turns[row]] for i in turn]
    # Every turn's context handed to the engine is a prefix of the final row (nothing before it was re-rendered).
    for call in engine.calls:
        for context in call:
            assert any(out.sequences[r][out.sequences[r] != 0].tolist()[: len(context)] == context for r in range(2))
    env = out.environment_mask
    assert (
        not (env & out.response_mask).any()
        and (env | out.response_mask).eq(out.attention_mask[:, -env.shape[1] :].bool()).all()
    )

"""The rollout loop: stop reasons, one budget per trajectory, tool errors, truncated tool results, first messages,
rewards with the conversation and the environment, and mask_truncated."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.agents import TRUNCATION_MARKER, MultiTurnConfig, MultiTurnRollout
from lit_entropy.rewards import score_responses
from lit_entropy.rollout import SamplingConfig
from lit_entropy.rollout.trajectories import STOP_REASONS
from tests.agents._agents import ScriptedEngine, chat_tokenizer
from tests.agents.test_agents_template import CALL, EOS, _batch


def _run(replies, budget=200, questions=("2*3?",), answers=("6",), **config):
    tokenizer = chat_tokenizer()
    config = {"environment": "tests.agents._agents:Calculator", "max_turns": 3, **config}
    rollout = MultiTurnRollout(MultiTurnConfig(**config))
    rollout.bind(tokenizer, [EOS])
    batch = _batch(tokenizer, list(questions), list(answers))
    out = rollout.generate(ScriptedEngine(tokenizer, replies), None, batch, SamplingConfig(1, max_new_tokens=budget))
    return tokenizer, out


def _stops(out):
    return [STOP_REASONS[i] for i in out.trajectories.stop_reasons.tolist()]


def test_stop_reasons_eos_max_turns_length():
    # row 0 answers at once (eos); row 1 calls tools on every turn (max_turns: the last call is not run); row 2 runs
    # out of its budget inside a turn (length).
    replies = [["6<eos>", CALL, CALL], [CALL, "1" * 300], [CALL]]  # per turn, the live rows' replies
    _, out = _run(replies, budget=250, questions=("a", "b", "c"), answers=("6", "6", "6"))
    assert _stops(out) == ["eos", "max_turns", "length"]
    assert out.trajectories.turns.tolist() == [1, 3, 2]
    assert out.trajectories.tool_calls.tolist() == [0, 3, 1]
    records = out.trajectories
    assert records.environment_rewards.tolist() == [0.0, 1.0, 1.0]  # Calculator.get_reward: a multiply was run
    # One budget over the whole trajectory: policy and environment tokens together fill exactly 250 on row 2.
    used = out.attention_mask[:, -out.response_mask.shape[1] :].sum(-1)
    assert int(used[2]) == 250 and bool((used <= 250).all())


def test_an_answer_that_leaves_no_room_for_another_turn_ends_the_trajectory_as_length():
    call_len = len(chat_tokenizer()(CALL, add_special_tokens=False)["input_ids"])
    _, out = _run([[CALL]], budget=call_len + 3)  # "|tool:6|assistant:" does not fit in 3
    assert _stops(out) == ["length"]
    assert out.environment_mask.sum() == 0 and int(out.response_mask.sum()) == call_len


def test_text_environment_stops_on_done_and_sums_its_rewards():
    replies = [["3<eos>"], ["9<eos>"], ["6<eos>"]]
    _, out = _run(replies, environment="tests.agents._agents:Guess")
    assert _stops(out) == ["done"] and out.trajectories.turns.tolist() == [3]
    assert out.trajectories.environment_rewards.tolist() == pytest.approx([-0.1 - 0.1 + 1.0])
    roles = [(m["role"], m["content"]) for m in out.trajectories.conversations[0]]
    assert roles == [("assistant", "3"), ("user", "higher"), ("assistant", "9"), ("user", "lower"), ("assistant", "6")]


def test_tool_errors_are_answered_and_counted():
    bad = [
        '<tool_call>{"name":"nope","arguments":{}}</tool_call>',  # unknown tool
        "<tool_call>{oops</tool_call>",  # bad JSON
        '<tool_call>{"name":"multiply","arguments":{"a":1}}</tool_call>',  # missing argument
        '<tool_call>{"name":"multiply","arguments":{"a":2,"b":3}}</tool_call>',  # over max_tool_calls_per_turn=3
    ]
    _, out = _run([["".join(bad) + "<eos>"], ["6<eos>"]], budget=600, max_tool_calls_per_turn=3)
    assert out.trajectories.tool_calls.tolist() == [4] and out.trajectories.tool_errors.tolist() == [4]
    tools = [m["content"] for m in out.trajectories.conversations[0] if m["role"] == "tool"]
    assert len(tools) == 4 and all(t.startswith("Error:") for t in tools)
    assert "unknown tool 'nope'" in tools[0] and "more than 3 tool calls" in tools[3]


def test_long_tool_results_are_cut_at_the_token_limit_and_marked():
    call = '<tool_call>{"name":"multiply","arguments":{"a":123456789,"b":987654321}}</tool_call><eos>'
    _, out = _run([[call], ["x<eos>"]], max_tool_response_tokens=5)
    (tool,) = [m["content"] for m in out.trajectories.conversations[0] if m["role"] == "tool"]
    assert tool == str(123456789 * 987654321)[:5] + TRUNCATION_MARKER


def test_a_first_message_from_reset_is_a_user_message_after_the_prompt():
    tokenizer, out = _run([["6<eos>"]], environment="tests.agents._agents:Greeter")
    messages = [{"role": "user", "content": "2*3?"}, {"role": "user", "content": "hi"}]
    want = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))["input_ids"]
    prompt = out.sequences[0, : out.prompt_length][out.attention_mask[0, : out.prompt_length].bool()].tolist()
    assert prompt == want


def test_the_reward_function_gets_the_conversation_and_environment_and_the_environment_reward_adds():
    tokenizer, out = _run([[CALL, "7<eos>"], ["6<eos>"]], questions=("a", "b"), answers=("6", "6"))
    seen = {}

    def reward(completions, answers, conversations, environments):
        seen.update(completions=completions, roles=[[m["role"] for m in c] for c in conversations], envs=environments)
        return [float(c == a) for c, a in zip(completions, answers, strict=True)]

    rewards, completions = score_responses(reward, "reward", tokenizer, out, ["6", "6"], 1)
    assert completions == ["6", "7"] == seen["completions"]  # the last policy turn is the answer
    assert seen["roles"] == [["assistant", "tool", "assistant"], ["assistant"]]
    assert seen["envs"][0].used == 1 and seen["envs"][1].used == 0
    assert rewards.tolist() == [1.0 + 1.0, 0.0]  # reward function + Calculator.get_reward()


def test_mask_truncated_drops_length_rows_even_when_their_last_token_is_eos():
    from lit_entropy.settings import LossConfig, RFTSettings  # noqa: PLC0415 - reason: keeps this test's imports local
    from lit_entropy.step import build_experience  # noqa: PLC0415 - reason: as above
    from lit_entropy.step.experience import RolloutStatistics  # noqa: PLC0415 - reason: as above

    call_len = len(chat_tokenizer()(CALL, add_special_tokens=False)["input_ids"])
    _, out = _run([[CALL, "6<eos>"]], budget=call_len + 3, questions=("a", "b"), answers=("6", "6"))
    assert _stops(out) == ["length", "eos"] and int(out.responses[0, call_len - 1]) == EOS
    zeros = torch.zeros(out.response_mask.shape)
    stats = RolloutStatistics(old_logprobs=zeros, entropy=zeros, discriminator=zeros)
    settings = RFTSettings.build(
        sampling=SamplingConfig(2, max_new_tokens=call_len + 3), loss=LossConfig(mask_truncated=True)
    )
    experience = build_experience(out, torch.tensor([1.0, 0.0]), stats, settings, eos_token_ids=(EOS,))
    assert experience.loss_mask.sum(-1).tolist() == [0, 2]

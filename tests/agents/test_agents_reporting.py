"""``train/multi_turn/*`` against counts taken by hand from the scripted trajectories; the samples table shows roles
and masked spans."""

from __future__ import annotations

import pytest

from lit_entropy.reporting.multi_turn import conversation_cells, multi_turn_scalars, truncated_trajectories
from tests.agents.test_agents_rollout import _run
from tests.agents.test_agents_template import CALL

BAD = '<tool_call>{"name":"nope","arguments":{}}</tool_call>'


def test_scalars_equal_the_hand_counts():
    # row 0: answer at once; row 1: one good call then answer; row 2: a good and a bad call, then max_turns.
    replies = [["6<eos>", CALL, CALL[:-5] + BAD + "<eos>"], ["6<eos>", CALL], [CALL]]
    tokenizer, out = _run(replies, budget=400, questions=("a", "b", "c"), answers=("6", "6", "6"))
    scalars = multi_turn_scalars(out)
    turns = ["6<eos>", CALL, CALL[:-5] + BAD + "<eos>", "6<eos>", CALL, CALL]
    policy = sum(len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in turns)
    # Environment tokens: per answered turn, "|tool:<result>|assistant:" for each message set, rendered by hand.
    answers = ["|tool:6|assistant:", "|tool:6|tool:Error: unknown tool 'nope'; the tools are ['multiply']|assistant:"]
    env = len(answers[0]) * 2 + len(answers[1])
    assert int(out.environment_mask.sum()) == env
    assert int(out.response_mask.sum()) == policy
    assert scalars["train/multi_turn/turns"] == pytest.approx((1 + 2 + 3) / 3)
    # Calls written, the one at max_turns (not run) included: 0, 1, 1 + 2 + 1.
    assert scalars["train/multi_turn/tool_calls"] == pytest.approx((0 + 1 + 4) / 3)
    assert scalars["train/multi_turn/tool_error_rate"] == pytest.approx(1 / 5)
    assert scalars["train/multi_turn/environment_token_frac"] == pytest.approx(env / (env + policy))
    assert scalars["train/multi_turn/environment_reward"] == pytest.approx((0 + 1 + 1) / 3)
    stops = {k.rsplit("/", 1)[1]: v for k, v in scalars.items() if "/stop/" in k}
    assert stops == pytest.approx({"eos": 2 / 3, "max_turns": 1 / 3, "length": 0.0, "done": 0.0})
    assert truncated_trajectories(out, 400, [1]).tolist() == [False, False, False]


def test_the_samples_table_shows_roles_and_masked_spans():
    tokenizer, out = _run([[CALL], ["6<eos>"]])
    (cell,) = conversation_cells(out, tokenizer)
    assert cell == (f"**assistant**: {CALL} [masked tool: |tool:6|assistant:] **assistant**: 6<eos> (stop: eos)")

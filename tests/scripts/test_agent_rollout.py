"""The plain multi-turn sampler and supervised batches of the agent demonstrations' base models
(``scripts/assets/agent_rollout.py``), on hand-checked conversations and a scripted model."""

from __future__ import annotations

import torch

from lit_entropy.environments.calculator import calculate
from lit_entropy.environments.char_chat import build_char_chat_tokenizer
from lit_entropy.environments.guessing_game import GuessingGame
from lit_entropy.models.tiny import build_qwen2
from scripts.assets.agent_rollout import hermes_call, play_text_environment, play_trajectories, supervised_batch
from scripts.assets.make_calculator_model import supervised_messages, tool_call_text
from scripts.assets.make_guessing_model import random_consistent_game


def test_supervised_labels_cover_the_policy_turns_only() -> None:
    tok = build_char_chat_tokenizer()
    row = {"prompt": "47*86=", "answer": "4042"}
    batch = supervised_batch([supervised_messages(row, True), supervised_messages(row, False)], tok)
    call = tool_call_text("47*86")
    # hand count: prompt 6 chars; call = 2 tags + the JSON's chars; <eos>; the tool response (tags + 4042); 4042 <eos>
    call_len = 2 + len(call) - len("<tool_call>") - len("</tool_call>")
    assert batch["attention_mask"][0].sum() == 6 + call_len + 1 + 1 + 4 + 1 + 4 + 1
    labelled = batch["labels"][0][batch["labels"][0] != -100].tolist()
    assert tok.decode(labelled) == call + "<eos>4042<eos>"
    assert tok.decode(batch["labels"][1][batch["labels"][1] != -100].tolist()) == "4042<eos>"
    assert batch["attention_mask"][1].sum() == 6 + 5  # right padding after the direct answer
    assert hermes_call(call) == ("calculate", {"expression": "47*86"})
    assert calculate(hermes_call(call)[1]["expression"]) == "4042"
    assert hermes_call("<tool_call>{oops</tool_call>") is None and hermes_call("4042") is None


def test_random_consistent_games_keep_to_the_feedback() -> None:
    import random  # noqa: PLC0415 - reason: only this test draws games

    rng = random.Random(0)
    for _ in range(200):
        secret = rng.randint(1, 16)
        game = random_consistent_game(secret, 1, 16, 6, rng)
        low, high = 1, 16
        for m in game[1:]:
            if m["role"] == "assistant":
                guess = int(m["content"])
                assert low <= guess <= high
            else:
                low, high = (guess + 1, high) if m["content"] == "higher" else (low, guess - 1)
                assert (m["content"] == "higher") == (guess < secret)
        assert len([m for m in game if m["role"] == "assistant"]) <= 6


class _Scripted(torch.nn.Module):
    """A "model" whose generate writes a fixed text per call, to check the loops' bookkeeping."""

    def __init__(self, tok, texts: list[str]) -> None:
        super().__init__()
        self.tok, self.texts, self.contexts = tok, list(texts), []

    def generate(self, input_ids, attention_mask, **kwargs):
        self.contexts.append([row[mask.bool()].tolist() for row, mask in zip(input_ids, attention_mask, strict=True)])
        ids = self.tok(self.texts.pop(0), add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        return torch.cat([input_ids, torch.tensor([ids] * len(input_ids))], dim=1)


def test_calculator_loop_runs_the_tool_and_appends_its_result_as_ids() -> None:
    tok = build_char_chat_tokenizer()
    model = _Scripted(tok, [tool_call_text("12*3"), "36"])
    (traj,) = play_trajectories(
        model, tok, ["12*3="], samples=1, seed=0, call_tokens=64, answer_tokens=8, tool=calculate
    )
    assert traj.called and traj.replies == ["36"] and traj.turns == [tool_call_text("12*3"), "36"]
    second_context = tok.decode(model.contexts[1][0])
    assert second_context == "12*3=" + tool_call_text("12*3") + "<eos><tool_response>36</tool_response>"


def test_text_environment_loop_plays_to_the_end_against_the_game() -> None:
    tok = build_char_chat_tokenizer()
    model = _Scripted(tok, ["8", "4", "2", "3"])
    rows = [{"prompt": "guess1-16", "answer": "3"}]
    (game,) = play_text_environment(
        model, tok, rows, lambda: GuessingGame(max_turns=6), samples=1, seed=0, max_turns=6, turn_tokens=4
    )
    assert game.turns == ["8", "4", "2", "3"] and game.replies == ["lower", "lower", "higher"] and game.done
    assert game.reward == (6 - 4) / 6
    assert tok.decode(model.contexts[-1][0]) == "guess1-168<eos>lower4<eos>lower2<eos>higher"


def test_a_real_tiny_model_samples_through_both_loops() -> None:
    tok = build_char_chat_tokenizer()
    model = build_qwen2(tok, hidden_size=32, num_layers=1)
    trajectories = play_trajectories(model, tok, ["1+2=", "3*4="], samples=3, seed=0, call_tokens=8, answer_tokens=4,
                                     tool=calculate)  # fmt: skip
    assert len(trajectories) == 6 and all(len(t.turns) in (1, 2) for t in trajectories)
    games = play_text_environment(model, tok, [{"prompt": "guess1-16", "answer": "5"}], GuessingGame, samples=2, seed=0,
                                  max_turns=3, turn_tokens=3)  # fmt: skip
    assert len(games) == 2 and all(1 <= len(g.turns) <= 3 for g in games)

"""DAPO dynamic sampling pieces against hand-computed cases: which groups are kept, padding of merged rollouts,
how many generation batches a fill draws, and the settings' one-line errors."""

from __future__ import annotations

import io

import pytest
import torch

from lit_entropy.rollout import RolloutBatch
from lit_entropy.settings import RFTSettings, TrainingSamplingConfig
from lit_entropy.step.estimator_inputs import (
    REWARD_BASELINES,
    REWARD_COMPONENTS,
    estimator_inputs,
    per_prompt_components,
)
from lit_entropy.step.group_fill import GroupFill, advance_fill, cat_rollouts, informative_groups

PAD = 0


def test_informative_groups_read_correctness_not_the_reward_value():
    # group size 2, threshold 1: [1, 1] all correct, [0, 0] all wrong, [1, 0] mixed, [0.5, 2] mixed,
    # [2, 3] all correct although the rewards differ (a shaped reward would differ too: not the rule).
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.5, 2.0, 2.0, 3.0])
    assert informative_groups(rewards, 2, 1.0).tolist() == [False, False, True, True, False]
    # threshold 0.5: [0.5, 2] is all correct now; [0, 0] still all wrong
    assert informative_groups(rewards, 2, 0.5).tolist() == [False, False, True, False, False]
    # group size 5: rows 0-4 = 1, 1, 0, 0, 1 (mixed), rows 5-9 = 0, 0.5, 2, 2, 3 (mixed)
    assert informative_groups(rewards, 5, 1.0).tolist() == [True, True]


def _rollout(prompts: list[list[int]], responses: list[list[int]], lengths: list[int]) -> RolloutBatch:
    """Rows of equal prompt width (0 = left padding) and response width; ``lengths`` response tokens are valid."""
    sequences = torch.tensor([p + r for p, r in zip(prompts, responses, strict=True)])
    prompt_mask = (torch.tensor(prompts) != PAD).long()
    response_mask = torch.tensor([[t < n for t in range(len(responses[0]))] for n in lengths])
    return RolloutBatch(sequences, torch.cat([prompt_mask, response_mask.long()], 1), response_mask)


def test_cat_rollouts_left_pads_prompts_and_right_pads_responses():
    a = _rollout([[0, 5], [6, 7]], [[1, 2, 3], [4, 0, 0]], [3, 1])  # prompt width 2, response width 3
    b = _rollout([[8, 9, 10]], [[11, 12]], [2])  # prompt width 3, response width 2
    out = cat_rollouts([a, b], PAD)
    assert out.prompt_length == 3
    assert out.sequences.tolist() == [[0, 0, 5, 1, 2, 3], [0, 6, 7, 4, 0, 0], [8, 9, 10, 11, 12, 0]]
    assert out.attention_mask.tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 0]]
    assert out.response_mask.tolist() == [[True] * 3, [True, False, False], [True, True, False]]
    assert out.rollout_logprobs is None
    # positions skip left padding, so each row's tokens keep the positions they were generated at
    assert out.position_ids[2].tolist()[:5] == [0, 1, 2, 3, 4] and out.position_ids[1].tolist()[:4] == [0, 0, 1, 2]
    a.rollout_logprobs, b.rollout_logprobs = torch.full((2, 3), -1.0), torch.full((1, 2), -2.0)
    assert cat_rollouts([a, b], PAD).rollout_logprobs.tolist() == [[-1.0] * 3, [-1.0] * 3, [-2.0, -2.0, 0.0]]


def _generation(answers: list[str], rewards: list[float], width: int = 2) -> tuple:
    """A generation batch of ``len(answers)`` prompts x 2 samples: prompt ids = the prompt's index, padded."""
    groups = len(answers)
    ids = torch.tensor([[PAD] * (width - 1) + [int(a)] for a in answers])
    batch = {"input_ids": ids, "attention_mask": (ids != PAD).long(), "prompts": answers, "answers": answers}
    rows = ids.repeat_interleave(2, 0)
    responses = torch.arange(2 * groups).unsqueeze(-1) + 100  # row r answers 100 + r
    rollout = RolloutBatch(
        torch.cat([rows, responses], 1), torch.cat([(rows != PAD).long(), torch.ones_like(responses)], 1),
        torch.ones_like(responses, dtype=torch.bool),
    )  # fmt: skip
    completions = [f"{a}/{s}" for a in answers for s in range(2)]
    return batch, rollout, torch.tensor(rewards), completions


def _advance(fill: GroupFill, generation: tuple, max_gen_batches: int = 10):
    return advance_fill(fill, *generation, correct_threshold=1.0, max_gen_batches=max_gen_batches)


def test_a_fill_draws_until_a_batch_of_informative_groups_and_drops_the_surplus():
    # batch of 3 prompts, 2 samples each. Generation 1 keeps prompt 2 (rewards 1, 0); generation 2 keeps none;
    # generation 3 keeps prompts 7 and 9: 3 kept after 3 generations = a batch. Generation 4 keeps 11, 12, 13:
    # a batch at once; the fill after it trains on 11, 12, 13.
    first = _advance(GroupFill(), _generation(["1", "2", "3"], [1, 1, 1, 0, 0, 0]))
    assert (first.done, first.fill.groups_kept, first.fill.gen_batches, first.counts.drawn) == (False, 1, 1, 3)
    second = _advance(first.fill, _generation(["4", "5", "6"], [0, 0, 1, 1, 0, 0]))
    assert (second.done, second.fill.groups_kept, second.fill.gen_batches) == (False, 1, 2)
    third = _advance(second.fill, _generation(["7", "8", "9"], [0, 1, 1, 1, 1, 0], width=3))
    assert (third.done, third.train_groups, third.fill.gen_batches) == (True, 3, 3)
    assert (third.counts.kept, third.counts.drawn) == (3, 9)
    taken = third.fill.take(third.train_groups, PAD)
    assert taken.batch["answers"] == ["2", "7", "9"]
    assert taken.completions == ["2/0", "2/1", "7/0", "7/1", "9/0", "9/1"]
    assert taken.rewards.tolist() == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0]
    assert taken.batch["input_ids"].tolist() == [[0, 0, 2], [0, 0, 7], [0, 0, 9]]  # widths 2 and 3 merged
    assert taken.rollout.responses.flatten().tolist() == [102, 103, 100, 101, 104, 105]
    # more informative groups than a batch: 1 kept, then 2 more in a batch of 2: the first 2 are trained
    one = _advance(GroupFill(), _generation(["11", "12"], [1, 0, 1, 1]))
    three = _advance(one.fill, _generation(["13", "14"], [0, 1, 1, 0]))
    assert (three.done, three.train_groups, three.counts.kept) == (True, 2, 3)
    assert three.fill.take(2, PAD).batch["answers"] == ["11", "13"]


def test_max_gen_batches_trains_on_what_there_is_and_an_empty_fill_trains_on_nothing():
    gens = [_generation(["1", "2"], [1, 1, 1, 0]), _generation(["3", "4"], [0, 0, 0, 0])]
    step = _advance(GroupFill(), gens[0], max_gen_batches=2)
    assert not step.done
    step = _advance(step.fill, gens[1], max_gen_batches=2)
    assert (step.done, step.train_groups, step.fill.gen_batches, step.counts.kept, step.counts.drawn) == (
        True, 1, 2, 1, 4,
    )  # fmt: skip
    assert step.fill.take(1, PAD).batch["answers"] == ["2"]
    empty = _advance(GroupFill(), gens[1], max_gen_batches=1)
    assert (empty.done, empty.train_groups) == (True, 0)


def test_a_fill_survives_a_checkpoint_round_trip():
    fill = _advance(GroupFill(), _generation(["1", "2"], [1, 0, 1, 1])).fill
    buffer = io.BytesIO()
    torch.save(fill.state_dict(), buffer)
    buffer.seek(0)
    again = GroupFill.from_state_dict(torch.load(buffer, weights_only=True))
    assert (again.gen_batches, again.groups_drawn, again.groups_kept) == (1, 2, 1)
    original, restored = fill.take(1, PAD), again.take(1, PAD)
    assert torch.equal(original.rollout.sequences, restored.rollout.sequences)
    assert original.completions == restored.completions == ["1/0", "1/1"]


def test_a_fill_keeps_the_estimators_per_prompt_inputs_with_their_groups():
    """remax's greedy baselines and the reward's named components follow their prompts through the fill (and a
    checkpoint of it), so the update's estimator reads the kept groups' own values."""
    gens = []
    for answers, rewards in ((["1", "2", "3"], [1, 1, 1, 0, 0, 1]), (["4", "5", "6"], [0, 0, 1, 0, 1, 1])):
        batch, rollout, scored, completions = _generation(answers, rewards)
        batch[REWARD_BASELINES] = [float(a) / 10 for a in answers]
        batch[REWARD_COMPONENTS] = per_prompt_components({"c": scored.float(), "n": -scored.float()}, 2)
        gens.append((batch, rollout, scored, completions))
    step = _advance(GroupFill(), gens[0])
    buffer = io.BytesIO()
    torch.save(step.fill.state_dict(), buffer)
    buffer.seek(0)
    step = _advance(GroupFill.from_state_dict(torch.load(buffer, weights_only=True)), gens[1])
    assert (step.done, step.train_groups) == (True, 3)
    taken = step.fill.take(3, PAD)
    assert taken.batch["answers"] == ["2", "3", "5"]
    inputs = estimator_inputs(taken.batch, 2, {"n": 0.5})
    assert inputs["reward_baselines"].tolist() == pytest.approx([0.2, 0.2, 0.3, 0.3, 0.5, 0.5])
    assert inputs["reward_component_names"] == ("c", "n") and inputs["reward_weights"] == [1.0, 0.5]
    assert inputs["reward_components"][:, 0].tolist() == taken.rewards.tolist() == [1, 0, 0, 1, 1, 0]
    assert torch.equal(inputs["reward_components"][:, 1], -inputs["reward_components"][:, 0])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (dict(max_gen_batches=0), "model.sampling.max_gen_batches must be an integer >= 1, got 0"),
        (dict(max_gen_batches=2.5), "model.sampling.max_gen_batches must be an integer >= 1, got 2.5"),
        (dict(filter_groups="yes"), "model.sampling.filter_groups must be true or false, got 'yes'"),
        (dict(filter_groups=True, num_samples=1), "model.sampling.filter_groups=True needs model.sampling.num_samples "
         ">= 2, got 1"),
    ],
)  # fmt: skip
def test_settings_refuse_with_the_dotted_name_and_value(settings, message):
    with pytest.raises(ValueError, match="^" + message.replace("(", r"\(").replace(".", r"\.")):
        TrainingSamplingConfig(**settings)


def test_a_plain_sampling_config_or_a_mapping_builds_training_settings():
    from lit_entropy.rollout import SamplingConfig

    plain = RFTSettings.build(sampling=SamplingConfig(num_samples=4)).sampling
    assert isinstance(plain, TrainingSamplingConfig) and (plain.num_samples, plain.filter_groups) == (4, False)
    mapped = RFTSettings.build(sampling={"num_samples": 4, "filter_groups": True, "max_gen_batches": 3}).sampling
    assert (mapped.filter_groups, mapped.max_gen_batches) == (True, 3)

"""``model.sampling.multi_turn.reward_placement``: a text environment's per-turn rewards on their turns' last policy
tokens (``per_turn``) or summed on the trajectory's last token (``last_token``), against hand-computed advantages."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.settings import PPOConfig, RFTSettings
from lit_entropy.step.experience import token_advantages
from tests.agents.test_agents_rollout import EOS, _run

#: Guess (secret 6): "3" -> higher (-0.1), "9" -> lower (-0.1), "6" -> done (+1.0); each reply is 2 tokens.
REPLIES = [["3<eos>"], ["9<eos>"], ["6<eos>"]]
SCORE = 2.0  # what the reward function gives the trajectory


def _rollout(placement: str):
    _, out = _run(REPLIES, environment="tests.agents._agents:Guess", reward_placement=placement)
    return out


def test_per_turn_rewards_sit_on_each_turns_last_policy_token():
    out = _rollout("per_turn")
    ends = ((out.responses == EOS) & out.response_mask)[0].nonzero().flatten().tolist()
    assert len(ends) == 3 and out.environment_mask[0, ends[0] + 1]  # each turn ends in EOS, then the environment
    placed = out.trajectories.placed_rewards(out.response_mask.shape[1])
    expected = torch.zeros_like(placed)
    expected[0, ends] = torch.tensor([-0.1, -0.1, 1.0])
    torch.testing.assert_close(placed, expected, rtol=0, atol=0)
    assert out.trajectories.environment_rewards.tolist() == pytest.approx([0.8])  # the total is unchanged
    assert _rollout("last_token").trajectories.placed_rewards(out.response_mask.shape[1]) is None


@pytest.mark.parametrize("placement", ["per_turn", "last_token"])
def test_gae_credits_each_turn_with_its_own_reward(placement):
    """PPO's GAE with a zero critic, lambda 1, gamma 0.9, no whitening: the advantage of the k-th policy token is the
    discounted sum of the rewards from it on, counted in policy tokens (environment tokens are skipped)."""
    out = _rollout(placement)
    mask = out.response_mask
    settings = RFTSettings.build(algorithm="ppo", ppo=PPOConfig(gamma=0.9, lam=1.0, whiten_advantages=False))
    total = torch.tensor([SCORE + 0.8])  # the reward function's score plus the environment's rewards
    values = torch.zeros(mask.shape)
    placed = out.trajectories.placed_rewards(mask.shape[1])
    advantages, _ = token_advantages(total, mask, settings, values, None, placed)

    # by hand: 6 policy tokens, rewards on the 2nd, 4th and 6th
    per_token = [0.0, -0.1, 0.0, -0.1, 0.0, SCORE + 1.0] if placement == "per_turn" else [0.0] * 5 + [SCORE + 0.8]
    expected = [sum(0.9 ** (j - i) * per_token[j] for j in range(i, 6)) for i in range(6)]
    assert advantages[0][mask[0]].tolist() == pytest.approx(expected, abs=1e-6)
    assert (advantages[0][~mask[0]] == 0).all()
    if placement == "per_turn":  # e.g. the first token: 0.9 * -0.1 + 0.9^3 * -0.1 + 0.9^5 * 3.0
        assert expected[0] == pytest.approx(0.9 * -0.1 + 0.9**3 * -0.1 + 0.9**5 * 3.0)


def test_grpo_sees_the_trajectory_sum_either_way():
    out = _rollout("per_turn")
    mask = out.response_mask.repeat(2, 1)  # a group of 2: the trajectory and a copy scored lower
    placed = out.trajectories.placed_rewards(mask.shape[1]).repeat(2, 1)
    settings = RFTSettings.build(sampling={"num_samples": 2})
    total = torch.tensor([SCORE + 0.8, 0.8])
    per_turn, _ = token_advantages(total, mask, settings, None, None, placed)
    last_token, _ = token_advantages(total, mask, settings)
    torch.testing.assert_close(per_turn, last_token, rtol=0, atol=1e-6)
    # (r - mean) / std with Bessel's correction: (2.8 - 1.8) / sqrt(2)
    assert per_turn[0][mask[0]].unique().tolist() == pytest.approx([1.0 / 2.0**0.5], abs=1e-5)


def test_an_unknown_placement_is_refused_naming_the_setting():
    with pytest.raises(ValueError, match="model.sampling.multi_turn.reward_placement"):
        MultiTurnConfig(environment="tests.agents._agents:Guess", reward_placement="per_token")

"""The step reads the loss and the estimator from the registries by their settings: the defaults against loops,
and functions registered in the test reach the update loss / the experience with no other edit."""

from __future__ import annotations

import math
import statistics
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lit_entropy.functional import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, PolicyLossStats
from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.functional.registry import register_advantage_estimator, register_policy_loss
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import AdvantageConfig, LossConfig, PPOConfig, RFTSettings
from lit_entropy.step import (
    Experience,
    ResponseForward,
    RolloutStatistics,
    advantage_options,
    build_experience,
    update_loss,
)

LENGTHS = [3, 1, 4, 2]
WIDTH = 4


def _rollout() -> RolloutBatch:
    mask = torch.tensor([[t < length for t in range(WIDTH)] for length in LENGTHS])
    n = len(LENGTHS)
    return RolloutBatch(torch.zeros(n, WIDTH + 2, dtype=torch.long), torch.ones(n, WIDTH + 2), mask)


def _statistics(values: torch.Tensor | None = None) -> RolloutStatistics:
    zeros = torch.zeros(len(LENGTHS), WIDTH)
    return RolloutStatistics(old_logprobs=zeros, entropy=zeros, discriminator=zeros, old_values=values)


@pytest.fixture
def registered():
    """Names registered by a test are removed afterwards."""
    names: list[tuple[object, str]] = []
    yield names
    for registry, name in names:
        registry.unregister(name)


def test_default_grpo_experience_matches_a_loop_on_valid_tokens():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.5])
    settings = RFTSettings.build(sampling=SamplingConfig(num_samples=2))
    assert settings.advantages.estimator == "grpo" and settings.loss.policy_loss == "ppo"
    exp = build_experience(_rollout(), rewards, _statistics(), settings)
    expected = []
    for row, length in enumerate(LENGTHS):
        group = rewards[row - row % 2 : row - row % 2 + 2].tolist()
        adv = (rewards[row].item() - statistics.fmean(group)) / (statistics.stdev(group) + 1e-6)
        expected.append([adv if t < length else 0.0 for t in range(WIDTH)])
    assert exp.advantages.dtype == torch.float32 and exp.returns is None
    torch.testing.assert_close(exp.advantages, torch.tensor(expected), rtol=1e-6, atol=1e-7)


def test_default_ppo_experience_is_gae_on_the_critic_values():
    rewards = torch.tensor([1.0, -1.0, 0.5, 2.0])
    values = torch.arange(16, dtype=torch.float32).reshape(4, WIDTH) / 10
    settings = RFTSettings.build(algorithm="ppo", ppo=PPOConfig(gamma=0.9, lam=0.8, whiten_advantages=False))
    assert settings.advantages.estimator == "gae"
    assert advantage_options(settings) == {"scale": "group", "gamma": 0.9, "lam": 0.8, "whiten_advantages": False}
    exp = build_experience(_rollout(), rewards, _statistics(values), settings)
    for row, length in enumerate(LENGTHS):
        v = values[row, :length].tolist() + [0.0]
        running, expected = 0.0, [0.0] * WIDTH
        for t in reversed(range(length)):
            reward = rewards[row].item() if t == length - 1 else 0.0
            running = reward + 0.9 * v[t + 1] - v[t] + 0.9 * 0.8 * running
            expected[t] = running
        torch.testing.assert_close(exp.advantages[row], torch.tensor(expected), rtol=1e-6, atol=1e-6)
        returns = [a + values[row, t].item() if t < length else 0.0 for t, a in enumerate(expected)]
        torch.testing.assert_close(exp.returns[row], torch.tensor(returns), rtol=1e-6, atol=1e-6)


def test_a_registered_estimator_is_chosen_by_its_setting(registered):
    calls = []

    @register_advantage_estimator("test_step_reward_to_go")
    def reward_to_go(token_rewards, mask, *, group_size, values=None, **extra):
        """Each token's advantage: the reward still to come (no baseline)."""
        calls.append((group_size, values, extra))
        return token_rewards.flip(-1).cumsum(-1).flip(-1) * mask, None

    registered.append((ADVANTAGE_ESTIMATORS, "test_step_reward_to_go"))
    settings = RFTSettings.build(
        sampling=SamplingConfig(num_samples=2), advantages=AdvantageConfig(estimator="test_step_reward_to_go")
    )
    rewards = torch.tensor([1.0, 2.0, 3.0, 4.0])
    exp = build_experience(_rollout(), rewards, _statistics(values=torch.ones(4, WIDTH)), settings)
    expected = [
        [rewards[row].item() if t < length else 0.0 for t in range(WIDTH)] for row, length in enumerate(LENGTHS)
    ]
    assert torch.equal(exp.advantages, torch.tensor(expected))
    # values are passed only to estimators registered with needs_values=True; the options always.
    assert calls == [(2, None, {"scale": "group"})]


def test_a_registered_policy_loss_is_chosen_by_its_setting_and_gets_the_response_mask(registered):
    seen = {}

    @register_policy_loss("test_step_sequence_reinforce")
    def sequence_reinforce(logprobs, old_logprobs, advantages, mask, *, loss_agg_mode, response_mask, **extra):
        """-A * (mean log-prob over each sequence's response tokens), averaged over sequences."""
        seen.update(extra, loss_agg_mode=loss_agg_mode, response_mask=response_mask)
        kept = mask.to(logprobs.dtype)
        per_seq = (logprobs * kept).sum(-1) / response_mask.sum(-1) * advantages[:, 0]
        zero = torch.zeros((), dtype=logprobs.dtype)
        stats = PolicyLossStats(zero, zero, zero, zero, zero, zero + 1)
        return -per_seq.mean(), stats

    registered.append((POLICY_LOSSES, "test_step_sequence_reinforce"))
    settings = RFTSettings.build(
        sampling=SamplingConfig(num_samples=2), loss=LossConfig(policy_loss="test_step_sequence_reinforce")
    )
    rollout = _rollout()
    logprobs = torch.tensor([[-1.0, -2.0, -3.0, 9.0], [-0.5, 9.0, 9.0, 9.0], [-1.0] * 4, [-2.0, -2.0, 9.0, 9.0]])
    advantages = torch.tensor([1.0, -1.0, 2.0, 0.5]).unsqueeze(-1).expand(4, WIDTH)
    loss_mask = rollout.response_mask.clone()
    loss_mask[2, 0] = False  # a callback removed one token from the loss, not from the response
    zeros = torch.zeros(4, WIDTH)
    rows = Experience(
        rollout=rollout,
        rewards=torch.zeros(4),
        advantages=advantages,
        old_logprobs=zeros,
        entropy=zeros,
        discriminator=zeros,
        loss_mask=loss_mask,
    )
    stats = EntropyStats(logprobs=logprobs.requires_grad_(), entropy=zeros, discriminator=zeros, policy_average=None)
    forward = ResponseForward(stats)
    out = update_loss(forward, rows, settings, normalizer=4.0)
    # Independent sum: row 2 keeps 3 of its 4 tokens but divides by its 4 response tokens.
    per_seq = [1.0 * (-6.0 / 3), -1.0 * (-0.5 / 1), 2.0 * (-3.0 / 4), 0.5 * (-4.0 / 2)]
    assert out.loss.item() == pytest.approx(-sum(per_seq) / 4, rel=1e-6)
    assert torch.equal(seen["response_mask"], rollout.response_mask)
    assert seen["clip_ratio_high"] == 0.2 and seen["normalizer"] == 4.0 and seen["loss_agg_mode"] == "token-mean"
    assert out.terms["pg_loss"].item() == pytest.approx(-sum(per_seq) / 4, rel=1e-6)


def test_an_estimator_that_needs_values_gets_the_critic_values(registered):
    @register_advantage_estimator("test_step_td0", needs_values=True)
    def td0(token_rewards, mask, *, group_size, values=None, gamma=1.0, **extra):
        """One-step TD error with the next valid value (right-padded rows)."""
        next_values = torch.cat([values[:, 1:], torch.zeros_like(values[:, :1])], dim=-1) * mask.roll(-1, -1)
        advantages = (token_rewards + gamma * next_values - values) * mask
        return advantages, advantages + values * mask

    registered.append((ADVANTAGE_ESTIMATORS, "test_step_td0"))
    settings = RFTSettings.build(
        algorithm="ppo", ppo=PPOConfig(gamma=0.5), advantages=AdvantageConfig(estimator="test_step_td0")
    )
    values = torch.full((4, WIDTH), 2.0)
    exp = build_experience(_rollout(), torch.tensor([1.0, 1.0, 1.0, 1.0]), _statistics(values), settings)
    # Inside a response: 0 + 0.5 * 2 - 2 = -1; at its last token: 1 + 0 - 2 = -1 as well.
    expected = torch.tensor([[-1.0 if t < length else 0.0 for t in range(WIDTH)] for length in LENGTHS])
    assert torch.equal(exp.advantages, expected)
    assert torch.equal(exp.returns, (expected + 2.0) * (expected != 0))


def _readme_policy_loss_example() -> str:
    text = (Path(__file__).resolve().parents[2] / "docs" / "extending.md").read_text()
    item = text.index("- **A policy loss:**")
    start = text.index("```python\n", item) + len("```python\n")
    return textwrap.dedent(text[start : text.index("```\n", start)])


def test_the_docs_policy_loss_example_trains_by_its_import_path(tmp_path, monkeypatch):
    # The docs' my_losses.py, under a name of its own here (another test's module cannot shadow it).
    (tmp_path / "docs_example_losses.py").write_text(_readme_policy_loss_example())
    monkeypatch.syspath_prepend(str(tmp_path))
    path = "docs_example_losses:unclipped_pg"
    try:
        settings = RFTSettings.build(sampling=SamplingConfig(num_samples=2), loss=LossConfig(policy_loss=path))
        rollout = _rollout()
        g = torch.Generator().manual_seed(0)
        old = -torch.rand(4, WIDTH, generator=g, dtype=torch.float64)
        logprobs = (old + 0.5 * torch.randn(4, WIDTH, generator=g, dtype=torch.float64)).requires_grad_()
        advantages = torch.randn(4, 1, generator=g, dtype=torch.float64).expand(4, WIDTH)
        zeros = torch.zeros(4, WIDTH, dtype=torch.float64)
        rows = Experience(
            rollout=rollout,
            rewards=torch.zeros(4),
            advantages=advantages,
            old_logprobs=old,
            entropy=zeros,
            discriminator=zeros,
            loss_mask=rollout.response_mask,
        )
        stats = EntropyStats(logprobs=logprobs, entropy=zeros, discriminator=zeros, policy_average=None)
        out = update_loss(ResponseForward(stats), rows, settings, normalizer=float(sum(LENGTHS)))
        default = RFTSettings.build(sampling=SamplingConfig(num_samples=2))
        clipped = update_loss(ResponseForward(stats), rows, default, normalizer=float(sum(LENGTHS)))
        assert abs(clipped.loss.item() - out.loss.item()) > 1e-3  # the setting chose a different loss
        # Token-mean of -A * exp(logp - old) over the valid tokens, with no clip.
        terms = [
            -advantages[row, t].item() * math.exp(logprobs[row, t].item() - old[row, t].item())
            for row, length in enumerate(LENGTHS)
            for t in range(length)
        ]
        assert out.loss.item() == pytest.approx(sum(terms) / len(terms), rel=1e-12)
        out.loss.backward()
        expected_grad = [
            [terms[sum(LENGTHS[:row]) + t] / len(terms) if t < length else 0.0 for t in range(WIDTH)]
            for row, length in enumerate(LENGTHS)
        ]
        torch.testing.assert_close(logprobs.grad, torch.tensor(expected_grad, dtype=torch.float64))
    finally:
        POLICY_LOSSES.unregister(path)
        sys.modules.pop("docs_example_losses", None)

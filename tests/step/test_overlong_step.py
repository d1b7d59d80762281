"""Overlong handling in the experience: the soft penalty reaches the advantages only (correctness reads the
scored rewards), and ``model.loss.mask_truncated`` drops exactly the truncated rows' tokens from the loss."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional import avg_at_k
from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import LossConfig, RewardConfig, RFTSettings
from lit_entropy.step import ResponseForward, RolloutStatistics, build_experience, update_loss

EOS = 7
PROMPT = 2
WIDTH = 4  # = max_new_tokens


def _rollout(responses: list[list[int]], lengths: list[int]) -> RolloutBatch:
    n = len(lengths)
    ids = torch.tensor(responses)
    sequences = torch.cat([torch.ones(n, PROMPT, dtype=torch.long), ids], dim=1)
    mask = torch.tensor([[t < length for t in range(WIDTH)] for length in lengths])
    return RolloutBatch(sequences, torch.ones(n, PROMPT + WIDTH), mask)


def _statistics(n: int) -> RolloutStatistics:
    zeros = torch.zeros(n, WIDTH)
    return RolloutStatistics(old_logprobs=zeros, entropy=zeros, discriminator=zeros)


def _grpo(group: list[float]) -> list[float]:
    """GRPO group advantages (Bessel std + 1e-6), plain Python."""
    mean = sum(group) / len(group)
    std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
    return [(r - mean) / (std + 1e-6) for r in group]


def test_the_penalty_shapes_advantages_but_not_correctness():
    # M = 4, B = 2, factor 1: lengths 4 / 3 pay -1 / -0.5; lengths 2 / 1 pay nothing.
    lengths = [4, 2, 3, 1]
    rollout = _rollout([[5, 5, 5, 5], [5, EOS, 0, 0], [5, 5, EOS, 0], [EOS, 0, 0, 0]], lengths)
    rewards = torch.tensor([1.0, 1.0, 0.0, 0.0])
    reward = RewardConfig(overlong_buffer=2, overlong_penalty_factor=1.0)
    settings = RFTSettings.build(sampling=SamplingConfig(num_samples=2, max_new_tokens=WIDTH), reward=reward)
    exp = build_experience(rollout, rewards, _statistics(4), settings, eos_token_ids=(EOS,))
    shaped = [1.0 - 1.0, 1.0, 0.0 - 0.5, 0.0]
    expected = _grpo(shaped[:2]) + _grpo(shaped[2:])
    for row, length in enumerate(lengths):
        assert exp.advantages[row, :length].tolist() == pytest.approx([expected[row]] * length, rel=1e-5)
    # Correctness (Avg@K / Pass@K, train/reward) reads the rewards as scored.
    assert torch.equal(exp.rewards, rewards)
    correct = (exp.rewards >= settings.reward.correct_threshold).view(2, 2)
    assert avg_at_k(correct).item() == pytest.approx(0.5)
    # Off (the default): the first group is all-equal, so no signal.
    plain = build_experience(rollout, rewards, _statistics(4), RFTSettings.build(sampling=settings.sampling))
    assert plain.advantages[:2].abs().max().item() == 0.0


def test_mask_truncated_drops_exactly_the_truncated_rows_from_the_loss():
    lengths = [4, 2, 4, 3]  # row 0: 4 tokens, no EOS (truncated); row 2 ends in EOS at the limit
    rollout = _rollout([[5, 5, 5, 5], [5, EOS, 0, 0], [5, 5, 5, EOS], [5, 5, EOS, 0]], lengths)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    sampling = SamplingConfig(num_samples=2, max_new_tokens=WIDTH)
    loss = LossConfig(loss_agg_mode="token-sum", mask_truncated=True)
    settings = RFTSettings.build(sampling=sampling, loss=loss)
    exp = build_experience(rollout, rewards, _statistics(4), settings, eos_token_ids=(EOS,))
    response = rollout.response_mask
    assert exp.loss_mask[0].sum().item() == 0
    assert torch.equal(exp.loss_mask[1:], response[1:])
    # Advantages still come from the whole group, truncated row included.
    expected = _grpo([1.0, 0.0]) + _grpo([0.0, 1.0])
    for row, length in enumerate(lengths):
        assert exp.advantages[row, :length].tolist() == pytest.approx([expected[row]] * length, rel=1e-5)
    # At ratio 1 each kept token's token-sum loss is -A: the truncated row's 4 tokens are gone.
    logprobs = torch.zeros(4, WIDTH, requires_grad=True)
    forward = ResponseForward(EntropyStats(logprobs, torch.zeros(4, WIDTH), torch.zeros(4, WIDTH), None))
    out = update_loss(forward, exp, settings, normalizer=1.0)
    reference = -sum(expected[row] * lengths[row] for row in (1, 2, 3))
    assert out.loss.item() == pytest.approx(reference, rel=1e-5)
    kept = build_experience(rollout, rewards, _statistics(4), RFTSettings.build(sampling=sampling))
    assert torch.equal(kept.loss_mask, response)

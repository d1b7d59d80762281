"""The ``remax`` estimator against a loop (each sample's reward minus its prompt's greedy reward, on the valid
tokens), its registry attributes and its errors. verl's own is compared in tests/oracles."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.functional import (
    ADVANTAGE_ESTIMATORS,
    estimator_min_group_size,
    estimator_needs_greedy_baseline,
    outcome_token_rewards,
)


@pytest.mark.parametrize("group", [1, 3])
def test_remax_is_reward_minus_the_greedy_reward_on_valid_tokens(group):
    g = torch.Generator().manual_seed(group)
    n, t = 6, 5
    rewards = torch.rand(n, generator=g, dtype=torch.float64).round()  # ties with the baseline too
    baselines = torch.rand(n // group, generator=g, dtype=torch.float64).round().repeat_interleave(group)
    mask = torch.rand(n, t, generator=g) < 0.7
    mask[0] = False  # an all-masked row
    out, returns = ADVANTAGE_ESTIMATORS["remax"](
        outcome_token_rewards(rewards, mask), mask, group_size=group, reward_baselines=baselines, scale="group"
    )
    assert returns is None
    for row in range(n):
        for col in range(t):
            expected = float(rewards[row] - baselines[row]) if mask[row, col] else 0.0
            assert float(out[row, col]) == expected, (row, col)


def test_remax_is_registered_for_a_greedy_baseline_and_any_group_size():
    assert estimator_needs_greedy_baseline("remax") and estimator_min_group_size("remax") == 1
    assert not any(estimator_needs_greedy_baseline(name) for name in ADVANTAGE_ESTIMATORS.names() if name != "remax")


def test_remax_refuses_a_missing_or_misshapen_baseline():
    mask = torch.ones(2, 3, dtype=torch.bool)
    rewards = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="remax needs reward_baselines"):
        ADVANTAGE_ESTIMATORS["remax"](rewards, mask, group_size=1)
    with pytest.raises(ValueError, match=r"one greedy-completion reward per row, shape \(2,\), got \(1,\)"):
        ADVANTAGE_ESTIMATORS["remax"](rewards, mask, group_size=2, reward_baselines=torch.zeros(1))

"""RLOO, REINFORCE++ and REINFORCE++-baseline against float64 loops written from their papers' formulas.

Cases: random groups, all-equal groups, groups of 2, masks with padding and an empty row, the KL in the
reward, discounting; RLOO and the baseline refuse groups of 1.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional import (
    ADVANTAGE_ESTIMATORS,
    discounted_returns,
    outcome_token_rewards,
    reinforce_plus_plus_baseline_estimator,
    reinforce_plus_plus_estimator,
    rloo_estimator,
)


def make_case(seed: int, groups: int, group_size: int, t: int = 6, equal_group: bool = True):
    """``(rewards [N] float64, mask [N, T])`` with padding, an all-equal first group and an empty last row."""
    g = torch.Generator().manual_seed(seed)
    n = groups * group_size
    rewards = torch.randint(0, 3, (n,), generator=g).to(torch.float64) + 0.25 * torch.rand(n, generator=g)
    if equal_group:
        rewards[:group_size] = 0.7
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = torch.arange(t).unsqueeze(0) < lengths.unsqueeze(1)
    mask[-1] = False
    return rewards, mask


def whiten_ref(values: dict, eps: float = 1e-8) -> dict:
    """``(x - mean) / sqrt(var + eps)`` over the given entries, ``var`` with Bessel's correction."""
    xs = list(values.values())
    mean = math.fsum(xs) / len(xs)
    var = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1) if len(xs) > 1 else 0.0
    return {key: (x - mean) / math.sqrt(var + eps) for key, x in values.items()}


def as_tensor(entries: dict, mask: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(mask.shape, dtype=torch.float64)
    for (i, k), v in entries.items():
        out[i, k] = v
    return out


# -------------------------------------------------------------------------------------------- RLOO


@pytest.mark.parametrize(("groups", "group_size"), [(3, 4), (4, 2), (2, 5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_rloo_is_the_reward_minus_the_mean_of_the_others(seed, groups, group_size):
    rewards, mask = make_case(seed, groups, group_size)
    advantages, returns = rloo_estimator(outcome_token_rewards(rewards, mask), mask, group_size=group_size)
    assert returns is None
    expected = torch.zeros(mask.shape, dtype=torch.float64)
    r = rewards.tolist()
    for i in range(len(r)):
        start = i // group_size * group_size
        others = [r[j] for j in range(start, start + group_size) if j != i]
        for k in range(mask.shape[1]):
            if mask[i, k]:
                expected[i, k] = r[i] - math.fsum(others) / len(others)
    torch.testing.assert_close(advantages, expected, rtol=1e-12, atol=1e-12)
    assert torch.all(advantages[:group_size] == 0)  # an all-equal group, exactly


def test_rloo_group_of_two_is_plus_minus_the_difference():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    mask = torch.ones(4, 2, dtype=torch.bool)
    advantages, _ = rloo_estimator(outcome_token_rewards(rewards, mask), mask, group_size=2)
    torch.testing.assert_close(advantages[:, 0], torch.tensor([1.0, -1.0, 0.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus_baseline"])
@pytest.mark.parametrize("group_size", [1, 0, True])
def test_group_baselines_refuse_groups_of_one_naming_the_setting(name, group_size):
    mask = torch.ones(4, 3, dtype=torch.bool)
    token_rewards = outcome_token_rewards(torch.ones(4), mask)
    with pytest.raises(ValueError, match=r"model\.sampling\.num_samples >= 2, got") as info:
        ADVANTAGE_ESTIMATORS[name](token_rewards, mask, group_size=group_size)
    assert name in str(info.value)


def test_group_baselines_refuse_partial_groups():
    mask = torch.ones(5, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="group_size 2"):
        rloo_estimator(outcome_token_rewards(torch.ones(5), mask), mask, group_size=2)


# ------------------------------------------------------------------------------------- REINFORCE++


def reinforce_pp_ref(token_rewards, mask, gamma=1.0, kl=None, kl_coef=0.0) -> torch.Tensor:
    returns = {}
    for i in range(mask.shape[0]):
        valid = [k for k in range(mask.shape[1]) if mask[i, k]]
        for pos, k in enumerate(valid):
            # G_t = sum over later valid tokens s of gamma^(steps) (r_s - kl_coef * kl_s)
            returns[(i, k)] = math.fsum(
                gamma ** (j - pos) * (token_rewards[i, s].item() - (kl_coef * kl[i, s].item() if kl is not None else 0))
                for j, s in enumerate(valid)
                if j >= pos
            )
    return as_tensor(whiten_ref(returns), mask)


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reinforce_plus_plus_whitens_the_discounted_returns_with_the_kl_in_the_reward(seed, gamma):
    rewards, mask = make_case(seed, 3, 4)
    token_rewards = outcome_token_rewards(rewards, mask)
    g = torch.Generator().manual_seed(50 + seed)
    kl = torch.rand(mask.shape, generator=g, dtype=torch.float64) * 0.1
    plain, returns = reinforce_plus_plus_estimator(token_rewards, mask, group_size=4, gamma=gamma)
    assert returns is None
    torch.testing.assert_close(plain, reinforce_pp_ref(token_rewards, mask, gamma), rtol=1e-10, atol=1e-10)
    with_kl, _ = reinforce_plus_plus_estimator(token_rewards, mask, group_size=4, gamma=gamma, kl=kl, kl_coef=0.5)
    expected = reinforce_pp_ref(token_rewards, mask, gamma, kl, 0.5)
    torch.testing.assert_close(with_kl, expected, rtol=1e-10, atol=1e-10)
    assert not torch.allclose(with_kl, plain)
    valid = mask.sum().item()
    assert abs(with_kl[mask].sum().item()) < 1e-9 and with_kl[mask].square().sum().item() == pytest.approx(valid - 1)


def test_reinforce_plus_plus_ignores_groups_and_padding_garbage():
    rewards, mask = make_case(3, 2, 3)
    token_rewards = outcome_token_rewards(rewards, mask)
    dirty = torch.where(mask, token_rewards, torch.tensor(float("nan"), dtype=torch.float64))
    a, _ = reinforce_plus_plus_estimator(token_rewards, mask, group_size=1)
    kl_garbage = torch.where(mask, 0.0, float("inf"))  # no KL on valid tokens, inf on padding
    b, _ = reinforce_plus_plus_estimator(dirty, mask, group_size=6, kl=kl_garbage, kl_coef=0.3)
    torch.testing.assert_close(a, b)
    assert torch.all(a[~mask] == 0)


def test_discounted_returns_skip_invalid_positions():
    rewards = torch.tensor([[1.0, 9.0, 2.0, 4.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True, True]])
    expected = torch.tensor([[1 + 0.5 * 2 + 0.25 * 4, 0.0, 2 + 0.5 * 4, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(discounted_returns(rewards, mask, 0.5), expected)
    with pytest.raises(ValueError, match="gamma"):
        discounted_returns(rewards, mask, 1.5)


def test_reinforce_plus_plus_refuses_a_misshapen_kl_and_a_negative_coefficient():
    mask = torch.ones(2, 3, dtype=torch.bool)
    token_rewards = outcome_token_rewards(torch.ones(2), mask)
    with pytest.raises(ValueError, match="kl"):
        reinforce_plus_plus_estimator(token_rewards, mask, group_size=1, kl=torch.zeros(2, 2), kl_coef=0.1)
    with pytest.raises(ValueError, match="kl_coef"):
        reinforce_plus_plus_estimator(token_rewards, mask, group_size=1, kl=torch.zeros(2, 3), kl_coef=-1.0)


# ---------------------------------------------------------------------------- REINFORCE++-baseline


@pytest.mark.parametrize(("groups", "group_size"), [(3, 4), (4, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_reinforce_plus_plus_baseline_centres_by_group_then_whitens_over_the_batch(seed, groups, group_size):
    rewards, mask = make_case(seed, groups, group_size)
    advantages, returns = reinforce_plus_plus_baseline_estimator(
        outcome_token_rewards(rewards, mask), mask, group_size=group_size
    )
    assert returns is None
    r = rewards.tolist()
    centred = {}
    for i in range(len(r)):
        start = i // group_size * group_size
        group_mean = math.fsum(r[start : start + group_size]) / group_size
        for k in range(mask.shape[1]):
            if mask[i, k]:
                centred[(i, k)] = r[i] - group_mean
    torch.testing.assert_close(advantages, as_tensor(whiten_ref(centred), mask), rtol=1e-10, atol=1e-10)
    # The all-equal group is 0 before the whitening, so after it every one of its tokens holds one value.
    equal = advantages[:group_size][mask[:group_size]]
    assert torch.all(equal == equal[0])


def test_reinforce_plus_plus_baseline_of_all_equal_groups_is_zero():
    mask = torch.ones(4, 3, dtype=torch.bool)
    rewards = torch.tensor([0.3, 0.3, 1.0, 1.0], dtype=torch.float64)
    advantages, _ = reinforce_plus_plus_baseline_estimator(outcome_token_rewards(rewards, mask), mask, group_size=2)
    assert torch.all(advantages == 0)

"""Forking-decision testbed: task generator, reward, splits, and the count-matched random-masking control."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch

from lit_entropy.callbacks.random_masking import RandomNegativeMasking
from lit_entropy.protocol import TokenMaskContext, TokenMaskProvider
from lit_entropy.rewards import resolve_reward_fn
from scripts.studies.tasks.forking import (
    CLASS_PROBS,
    KEYS,
    STRATEGIES,
    apply_strategy,
    chain_sum_response,
    make_chain_examples,
    make_forking_examples,
    reward,
    strategy_of_key,
    write_splits,
)


def test_strategies_by_hand():
    assert apply_strategy("A", "0918") == "A0918.0918.0918.0918."
    assert apply_strategy("B", "0918") == "B1029.1029.1029.1029."
    assert apply_strategy("C", "0918") == "C5463.5463.5463.5463."
    assert apply_strategy("D", "0918") == "D9081.9081.9081.9081."
    assert chain_sum_response("35271866") == "3.8.0.7.8.6.2.8"
    assert [strategy_of_key(k) for k in "adehilmp"] == list("AABBCCDD")
    with pytest.raises(ValueError, match="key"):
        strategy_of_key("z")


def test_forking_rows_consistent_and_long_tailed():
    rows = make_forking_examples("train", 20000, seed=3)
    for row in rows[:200]:
        cls = strategy_of_key(row["prompt"][0])
        assert row["class"] == cls and row["answer"] == apply_strategy(cls, row["prompt"][1:-1])
        assert 25 <= len(row["answer"]) <= 35
    counts = Counter(r["class"] for r in rows)
    for s, p in zip(STRATEGIES, CLASS_PROBS, strict=True):
        # binomial standard error is < 0.0033 at n = 20000; allow 4 of them
        assert abs(counts[s] / len(rows) - p) < 0.013
    assert make_forking_examples("train", 50, seed=3) == rows[:0] + make_forking_examples("train", 50, seed=3)


def test_splits_disjoint_and_stratified():
    sets = {
        s: {r["prompt"][1:] for r in make_forking_examples(s, 3000, seed=0)} for s in ("train", "validation", "test")
    }
    assert not sets["train"] & sets["validation"] and not sets["train"] & sets["test"]
    assert not sets["validation"] & sets["test"]
    test = make_forking_examples("test", 1, seed=0, class_counts=(2, 0, 1, 3))
    assert [r["class"] for r in test] == list("AACDDD")
    chain = {s: {r["prompt"] for r in make_chain_examples(s, 500)} for s in ("train", "test")}
    assert not chain["train"] & chain["test"]


def test_short_executions_one_copy():
    """Issue 24 experiment B: one copy of the payload (8 tokens); the prompts are those of the 4-copy task."""
    assert apply_strategy("D", "0918", copies=1) == "D9081."
    assert apply_strategy("B", "0918", 2) == "B1029.1029."
    short = make_forking_examples("test", 1, seed=0, class_counts=(3, 2, 2, 1), payload_copies=1)
    full = make_forking_examples("test", 1, seed=0, class_counts=(3, 2, 2, 1))
    assert [r["prompt"] for r in short] == [r["prompt"] for r in full]
    assert [r["answer"] for r in short] == [r["answer"][:8] for r in full] and {len(r["answer"]) for r in short} == {8}
    for bad in (0, True, 1.0):
        with pytest.raises(ValueError, match="copies must be a positive int"):
            apply_strategy("A", "0918", bad)


def test_prior_draw_ignores_key():
    rows = make_forking_examples("train", 4000, seed=1, strategy_prior=(0.75, 0.15, 0.07, 0.03))
    chosen = Counter(r["answer"][0] for r in rows if r["class"] == "A")
    assert 0.70 < chosen["A"] / sum(chosen.values()) < 0.80
    assert all(r["answer"] == apply_strategy(r["answer"][0], r["prompt"][1:-1]) for r in rows[:100])


def test_reward_by_import_path(tmp_path):
    fn = resolve_reward_fn("scripts.studies.tasks.forking:reward")
    assert fn(["A0918.", "B0918.", " A0918.\n"], ["A0918."] * 3) == [1.0, 0.0, 1.0]
    assert fn is reward
    paths = write_splits(tmp_path, {"test": make_forking_examples("test", 3)})
    rows = [json.loads(line) for line in paths["test"].read_text().splitlines()]
    assert set(rows[0]) == {"prompt", "answer", "class"} and len(rows) == 3
    assert set(KEYS) >= {r["prompt"][0] for r in rows}


def _context(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    s = torch.randn(6, 9, generator=g, dtype=torch.float64) ** 3  # heavy tails, so Clip_B masks some tokens
    adv = torch.tensor([1.0, -1.0, -0.5, 0.7, -2.0, 0.0], dtype=torch.float64).unsqueeze(-1).expand(6, 9)
    mask = torch.rand(6, 9, generator=g) < 0.85
    return TokenMaskContext(mask=mask, advantages=adv.contiguous(), discriminator=s)


@pytest.mark.parametrize("mu", [0.5, 1.0, 2.5])
def test_random_masking_matches_clip_b_count(mu):
    ctx = _context()
    cb = RandomNegativeMasking(mu=mu, seed=7)
    assert isinstance(cb, TokenMaskProvider)
    keep = cb.keep_mask(None, object(), ctx)
    # Independent count of Clip_B's tokens: numpy mean and population std over the valid tokens.
    s, m, a = ctx.discriminator.numpy(), ctx.mask.numpy(), ctx.advantages.numpy()
    mean, std = s[m].mean(), s[m].std()
    expected = int(((a < 0) & (s - mean < -mu * std) & m).sum())
    removed = ctx.mask & ~keep
    assert int(removed.sum()) == expected
    assert bool((ctx.advantages[removed] < 0).all()) and not bool((keep & ~ctx.mask).any())
    if expected:
        other = RandomNegativeMasking(mu=mu, seed=8).keep_mask(None, object(), ctx)
        same = RandomNegativeMasking(mu=mu, seed=7).keep_mask(None, object(), ctx)
        assert torch.equal(same, keep)
        n_neg = int((ctx.mask & (ctx.advantages < 0)).sum())
        if expected < n_neg:
            assert not torch.equal(other, keep)


def test_random_masking_is_uniform_over_negative_tokens():
    ctx = _context(1)
    cb = RandomNegativeMasking(mu=0.5, seed=0)
    hits = torch.zeros(ctx.mask.shape)
    for _ in range(2000):
        hits += (ctx.mask & ~cb.keep_mask(None, object(), ctx)).double()
    neg = ctx.mask & (ctx.advantages < 0)
    freq = hits[neg] / 2000
    assert float(hits[~neg].sum()) == 0
    # every negative token is equally likely: count / n_neg (binomial std ~ 0.011 at 2000 draws)
    target = float(freq.mean())
    assert np.abs(freq.numpy() - target).max() < 0.06


def test_random_masking_bad_settings():
    with pytest.raises(ValueError, match="mu"):
        RandomNegativeMasking(mu=0)
    with pytest.raises(ValueError, match="seed"):
        RandomNegativeMasking(seed=1.5)

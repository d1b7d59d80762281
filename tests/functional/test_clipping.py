"""Clip_B / Clip_V keep masks against plain-Python references (statistics.pstdev, sorted lists)."""

from __future__ import annotations

import random
import statistics

import pytest
import torch
from _clipping_references import ref_cap, ref_clip_b, ref_clip_v

from lit_entropy.functional.masked import masked_moments
from lit_entropy.functional.selection import (
    TopKCut,
    cap_count,
    clip_b_mask,
    clip_v_deviation,
    clip_v_mask,
    clip_v_scores,
    kth_largest,
    local_top_scores,
    tie_counts,
)

# ---------------------------------------------------------------- plain-Python references


def _lists(*tensors):
    return [t.tolist() for t in tensors]


def _random_batch(rng: torch.Generator, B, T, *, heavy=False, quantize=None):
    S = torch.randn(B, T, generator=rng)
    if heavy:  # a few far outliers so that Clip_V candidates exist at moderate mu
        S = S * torch.where(torch.rand(B, T, generator=rng) < 0.05, 20.0, 1.0)
    if quantize:
        S = torch.round(S * quantize) / quantize
    E = 0.01 * torch.randn(B, T, generator=rng)
    A = torch.randn(B, generator=rng).unsqueeze(-1).expand(B, T).clone()
    A[torch.rand(B, T, generator=rng) < 0.1] = 0.0
    lengths = torch.randint(0, T + 1, (B,), generator=rng)
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(-1)
    return S, E, A, mask


# ---------------------------------------------------------------- Clip_B


@pytest.mark.parametrize("symmetric", [False, True])
def test_clip_b_matches_python_reference_random(symmetric):
    rng = torch.Generator().manual_seed(0)
    total_masked = 0
    for _ in range(60):
        B, T = int(torch.randint(1, 6, (1,), generator=rng)), int(torch.randint(1, 40, (1,), generator=rng))
        S, _, A, mask = _random_batch(rng, B, T, heavy=True)
        mu = float(torch.empty(()).uniform_(0.5, 3.0, generator=rng))
        keep = clip_b_mask(S, A, mask, mu=mu, symmetric=symmetric)
        assert keep.dtype == torch.bool
        assert keep.tolist() == ref_clip_b(*_lists(S, A, mask), mu, symmetric)
        total_masked += int((mask & ~keep).sum())
    assert total_masked > 20  # the comparison exercised real masking


def test_clip_b_crafted_one_sided_and_symmetric():
    # m = 0, s = 1 (population): values -2, -0.5 x3... build explicitly.
    S = torch.tensor([[-2.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    mask = torch.ones_like(S, dtype=torch.bool)
    m, s = statistics.fmean(S[0].tolist()), statistics.pstdev(S[0].tolist())
    assert m == 0.0 and s == pytest.approx(1.0)
    neg = torch.full_like(S, -1.0)
    pos = torch.full_like(S, 1.0)
    # A < 0: only the low outlier goes; S - m = -2 < -1.5 * 1.
    assert clip_b_mask(S, neg, mask, mu=1.5).tolist() == [[False] + [True] * 7]
    # A > 0 is never masked one-sided; symmetric masks the high outlier.
    assert clip_b_mask(S, pos, mask, mu=1.5).all()
    assert clip_b_mask(S, pos, mask, mu=1.5, symmetric=True).tolist() == [[True, False] + [True] * 6]
    # A == 0 is never masked.
    assert clip_b_mask(S, torch.zeros_like(S), mask, mu=0.1, symmetric=True).all()
    # The threshold is strict: mu = 2.0 puts -2 exactly on it (-2 < -2 is False).
    assert clip_b_mask(S, neg, mask, mu=2.0).all()
    # Per-sequence advantages [B] broadcast.
    assert clip_b_mask(S, torch.tensor([-1.0]), mask, mu=1.5).tolist() == [[False] + [True] * 7]


@pytest.mark.parametrize("value", [0.0, 0.1, -3.7e-3, 123.456])
def test_clip_b_zero_std_masks_nothing(value):
    S = torch.full((3, 50), value)
    mask = torch.rand(3, 50, generator=torch.Generator().manual_seed(1)) < 0.8
    A = -torch.ones(3, 50)
    keep = clip_b_mask(S, A, mask, mu=1e-3, symmetric=True)
    assert torch.equal(keep, mask)
    # Also for a single valid token.
    one = torch.zeros(1, 4, dtype=torch.bool)
    one[0, 2] = True
    assert torch.equal(clip_b_mask(torch.randn(1, 4), -torch.ones(1, 4), one, mu=0.1), one)
    # And for no valid token at all.
    none = torch.zeros(2, 3, dtype=torch.bool)
    assert not clip_b_mask(torch.randn(2, 3), -torch.ones(2, 3), none).any()


def test_clip_b_invalid_positions_never_kept_nor_counted():
    rng = torch.Generator().manual_seed(3)
    S, _, A, mask = _random_batch(rng, 4, 30, heavy=True)
    mask[0, 0] = False
    A = -A.abs() - 0.1  # everything negative: invalid outliers would be masked if counted
    base = clip_b_mask(S, A, mask, mu=1.0)
    garbage = S.clone()
    garbage[~mask] = torch.tensor([1e30, -1e30, float("nan"), float("inf")]).repeat(int((~mask).sum()))[
        : int((~mask).sum())
    ]
    adv = A.clone()
    adv[~mask] = float("nan")
    keep = clip_b_mask(garbage, adv, mask, mu=1.0)
    assert torch.equal(keep, base)
    assert not keep[~mask].any()
    assert keep.tolist() == ref_clip_b(*_lists(S, A, mask), 1.0)


def test_clip_b_global_moments_change_the_decision():
    # Local: 0,0,0,0,-1 -> m = -0.2, s = 0.4; -1 - m = -0.8 = -2 s -> masked at mu = 1.5.
    S = torch.tensor([[0.0, 0.0, 0.0, 0.0, -1.0]])
    mask = torch.ones_like(S, dtype=torch.bool)
    A = -torch.ones_like(S)
    assert clip_b_mask(S, A, mask, mu=1.5).tolist() == [[True, True, True, True, False]]
    # Another rank holds widely spread values: the global s is large and nothing is masked here.
    other = torch.tensor([[-4.0, 4.0, -3.0, 3.0, 0.0]])
    moments = masked_moments(S, mask) + masked_moments(other, mask)
    keep = clip_b_mask(S, A, mask, mu=1.5, moments=moments)
    assert keep.tolist() == ref_clip_b(*_lists(S, A, mask), 1.5, extra=other[0].tolist())
    assert keep.all()
    # Another rank holds tightly packed values around 0: now even the zeros' neighbour -1 is far out.
    tight = torch.zeros(1, 200)
    moments = masked_moments(S, mask) + masked_moments(tight, torch.ones_like(tight, dtype=torch.bool))
    keep = clip_b_mask(S, A, mask, mu=5.0, moments=moments)
    assert keep.tolist() == ref_clip_b(*_lists(S, A, mask), 5.0, extra=[0.0] * 200)
    assert keep.tolist() == [[True, True, True, True, False]]
    # Random shards: the global decision equals the reference on the concatenated batch.
    rng = torch.Generator().manual_seed(5)
    for _ in range(10):
        S1, _, A1, m1 = _random_batch(rng, 3, 20, heavy=True)
        S2, _, _, m2 = _random_batch(rng, 5, 20, heavy=True)
        moments = masked_moments(S1, m1) + masked_moments(S2, m2)
        extra = S2[m2].tolist()
        assert clip_b_mask(S1, A1, m1, mu=1.2, moments=moments).tolist() == ref_clip_b(
            *_lists(S1, A1, m1), 1.2, extra=extra
        )


# ---------------------------------------------------------------- Clip_V


@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("max_frac", [None, 0.02, 0.1, 1.0])
def test_clip_v_matches_python_reference_random(symmetric, max_frac):
    rng = torch.Generator().manual_seed(11)
    capped = 0
    for i in range(30):
        B, T = int(torch.randint(1, 8, (1,), generator=rng)), int(torch.randint(1, 60, (1,), generator=rng))
        S, E, A, mask = _random_batch(rng, B, T, heavy=i % 3 == 0, quantize=4 if i % 2 else None)
        mu = float(torch.empty(()).uniform_(0.3, 2.0, generator=rng))
        keep = clip_v_mask(S, E, A, mask, mu=mu, max_frac=max_frac, symmetric=symmetric)
        expected = ref_clip_v(*_lists(S, E, A, mask), mu, max_frac, symmetric)
        assert keep.tolist() == expected
        if max_frac is not None:
            n = int(mask.sum())
            _, cand = clip_v_scores(S, E, A, mask, mu=mu, symmetric=symmetric)
            capped += int(int(cand.sum()) > ref_cap(n, max_frac))
    if max_frac is not None and max_frac < 1:
        assert capped >= 5  # the cap actually bound in many batches


def _clip_v_case(D, A, mu=1.0, **kw):
    D = torch.tensor([D], dtype=torch.float32)
    return clip_v_mask(
        torch.zeros_like(D), D, torch.tensor([A], dtype=torch.float32), torch.ones_like(D).bool(), mu=mu, **kw
    )


def test_clip_v_ties_at_cap_mask_exactly_the_cap_in_token_order():
    # 20 valid tokens: D = 4, 5, 4, 4 and 16 zeros; population s = 1.711; mu = 1 -> the four are candidates.
    D = [4.0, 5.0, 4.0, 4.0] + [0.0] * 16
    s = statistics.pstdev(D)
    assert 1.0 * s < 4.0
    A = [-1.0] * 20
    keep = _clip_v_case(D, A, max_frac=0.1)  # k = 2: the 5, then the first of the three tied 4s
    assert keep[0, :4].tolist() == [False, False, True, True] and keep[0, 4:].all()
    keep = _clip_v_case([5.0, 4.0, 3.0, 3.0] + [0.0] * 16, A, max_frac=0.1)  # no tie at the cap
    assert keep[0, :4].tolist() == [False, False, True, True]
    # Any permutation: the 5 and the tied 4 that comes first in the new order.
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0)).tolist()
    keep_p = _clip_v_case([D[i] for i in perm], A, max_frac=0.1)
    first_four = min(j for j in range(20) if perm[j] in (0, 2, 3))
    assert {j for j in range(20) if not keep_p[0, j].item()} == {perm.index(1), first_four}
    # No cap: every candidate goes; max_frac = 1e-4 of 20 tokens -> cap 1 -> only the top score.
    assert int((~_clip_v_case([5.0, 4.0, 3.0, 3.0] + [0.0] * 16, A, max_frac=None)).sum()) == 4
    assert (~_clip_v_case([5.0, 4.0, 3.0, 3.0] + [0.0] * 16, A, max_frac=1e-4)).nonzero().tolist() == [[0, 0]]


def test_clip_v_sign_conventions_and_symmetric():
    # D = E_p[S] - S; large positive D with A < 0 is masked, with A > 0 kept (one-sided).
    D = [6.0, -6.0] + [0.0] * 18
    s = statistics.pstdev(D)
    assert 2.0 * s < 6.0
    keep = _clip_v_case(D, [-1.0, -1.0] + [-1.0] * 18, mu=2.0, max_frac=None)
    assert keep[0, :2].tolist() == [False, True]
    keep = _clip_v_case(D, [1.0, 1.0] + [-1.0] * 18, mu=2.0, max_frac=None)
    assert keep.all()
    keep = _clip_v_case(D, [1.0, 1.0] + [-1.0] * 18, mu=2.0, max_frac=None, symmetric=True)
    assert keep[0, :2].tolist() == [True, False]
    # D is compared raw (not re-centred): shift every D by +c and the decision follows the raw values.
    shifted = [d + 1.0 for d in D]
    keep = _clip_v_case(shifted, [-1.0] * 20, mu=2.0, max_frac=None)
    assert keep.tolist() == ref_clip_v([[0.0] * 20], [shifted], [[-1.0] * 20], [[True] * 20], 2.0, None)
    # Zero spread masks nothing.
    assert _clip_v_case([0.25] * 20, [-1.0] * 20, mu=1e-3, max_frac=None, symmetric=True).all()


def test_clip_v_invalid_positions_never_kept_nor_counted():
    rng = torch.Generator().manual_seed(8)
    S, E, A, mask = _random_batch(rng, 4, 40, heavy=True)
    mask[1, 0] = False
    base = clip_v_mask(S, E, A, mask, mu=0.8, max_frac=0.05)
    S2, E2, A2 = S.clone(), E.clone(), A.clone()
    S2[~mask] = -1e30
    E2[~mask] = float("nan")
    A2[~mask] = -1.0
    keep = clip_v_mask(S2, E2, A2, mask, mu=0.8, max_frac=0.05)
    assert torch.equal(keep, base)
    assert not keep[~mask].any()
    assert keep.tolist() == ref_clip_v(*_lists(S, E, A, mask), 0.8, 0.05)


@pytest.mark.parametrize("symmetric", [False, True])
def test_clip_v_sharded_equals_full_batch(symmetric):
    """The distributed recipe (global moments + gathered top scores) reproduces the full-batch mask."""
    rng = torch.Generator().manual_seed(21)
    for trial in range(8):
        S, E, A, mask = _random_batch(rng, 8, 50, heavy=True, quantize=2 if trial % 2 else None)
        full = clip_v_mask(S, E, A, mask, mu=0.7, max_frac=0.01, symmetric=symmetric)
        shards = [slice(0, 3), slice(3, 4), slice(4, 8)]
        D = clip_v_deviation(S, E)
        moments = sum(masked_moments(D[sl], mask[sl]) for sl in shards)
        k = cap_count(int(moments[0]), 0.01)
        scored = [
            clip_v_scores(S[sl], E[sl], A[sl], mask[sl], mu=0.7, symmetric=symmetric, moments=moments) for sl in shards
        ]
        thr = float(kth_largest(torch.cat([local_top_scores(sc, cand, k) for sc, cand in scored]), k))
        counts = [tie_counts(sc, cand, thr).tolist() for sc, cand in scored]
        above = sum(c[0] for c in counts)
        parts = [
            clip_v_mask(
                S[sl],
                E[sl],
                A[sl],
                mask[sl],
                mu=0.7,
                max_frac=0.01,
                symmetric=symmetric,
                moments=moments,
                cap_cut=TopKCut(k, thr, above, sum(c[1] for c in counts[:r])),
            )
            for r, sl in enumerate(shards)
        ]
        assert torch.equal(torch.cat(parts), full)
        assert full.tolist() == ref_clip_v(*_lists(S, E, A, mask), 0.7, 0.01, symmetric)


@pytest.mark.parametrize("symmetric", [False, True])
def test_clip_v_cap_with_heavy_ties_is_exact_whole_and_sharded(symmetric):
    """Integer-valued D: many candidates tie at the cap; exactly the cap is masked, on any sharding."""
    rng = torch.Generator().manual_seed(33)
    tied_across = 0
    for _ in range(40):
        B, T = 8, int(torch.randint(5, 30, (1,), generator=rng))
        S = torch.round(torch.randn(B, T, generator=rng) * 1.5).double()
        E = torch.zeros(B, T, dtype=torch.float64)
        A = torch.where(torch.rand(B, 1, generator=rng) < 0.6, -1.0, 1.0).double().expand(B, T)
        mask = torch.arange(T).unsqueeze(0) < torch.randint(1, T + 1, (B, 1), generator=rng)
        max_frac, mu = 0.05, 0.3
        full = clip_v_mask(S, E, A, mask, mu=mu, max_frac=max_frac, symmetric=symmetric)
        assert full.tolist() == ref_clip_v(*_lists(S, E, A, mask), mu, max_frac, symmetric)
        n = int(mask.sum())
        _, cand = clip_v_scores(S, E, A, mask, mu=mu, symmetric=symmetric)
        assert int((mask & ~full).sum()) == min(cap_count(n, max_frac), int(cand.sum()))
        split = int(torch.randint(1, B, (1,), generator=rng))
        shards = [slice(0, split), slice(split, B)]
        moments = sum(masked_moments(clip_v_deviation(S[sl], E[sl]), mask[sl]) for sl in shards)
        k = cap_count(n, max_frac)
        scored = [
            clip_v_scores(S[sl], E[sl], A[sl], mask[sl], mu=mu, symmetric=symmetric, moments=moments) for sl in shards
        ]
        thr = float(kth_largest(torch.cat([local_top_scores(sc, c, k) for sc, c in scored]), k))
        counts = [tie_counts(sc, c, thr).tolist() for sc, c in scored]
        above = sum(c[0] for c in counts)
        tied_across += int(all(c[1] > 0 for c in counts) and above + sum(c[1] for c in counts) > k)
        parts = [
            clip_v_mask(
                S[sl],
                E[sl],
                A[sl],
                mask[sl],
                mu=mu,
                max_frac=max_frac,
                symmetric=symmetric,
                moments=moments,
                cap_cut=TopKCut(k, thr, above, sum(c[1] for c in counts[:r])),
            )
            for r, sl in enumerate(shards)
        ]
        assert torch.equal(torch.cat(parts), full)
    assert tied_across >= 10  # ties at the cap on both shards, more than the cap: the tie-break decided


# ---------------------------------------------------------------- cap helpers and validation


def test_cap_count_matches_fraction_reference():
    r = random.Random(0)
    fracs = [1e-4, 0.29, 0.1, 0.3, 0.07, 0.5, 1.0, 0.001, 0.123]
    for _ in range(400):
        n, f = r.randint(0, 50000), r.choice(fracs)
        assert cap_count(n, f) == ref_cap(n, f), (n, f)
    assert cap_count(100, 0.29) == 29  # 0.29 * 100 = 28.999999999999996 in binary floating point
    assert cap_count(9999, 1e-4) == 1
    assert cap_count(20000, 1e-4) == 2
    assert cap_count(0, 0.5) == 1


@pytest.mark.parametrize("mu", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_mu_raises(mu):
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="mu"):
        clip_b_mask(x, x, m, mu=mu)
    with pytest.raises(ValueError, match="mu"):
        clip_v_mask(x, x, x, m, mu=mu)


@pytest.mark.parametrize("max_frac", [0.0, -0.1, 1.5])
def test_bad_max_frac_raises(max_frac):
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="max_frac"):
        clip_v_mask(x, x, x, m, max_frac=max_frac)
    with pytest.raises(ValueError, match="max_frac"):
        cap_count(10, max_frac)


def test_shape_mismatch_raises():
    x = torch.zeros(2, 3)
    m = torch.ones(2, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match="mask"):
        clip_b_mask(x, x, torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="advantages"):
        clip_b_mask(x, torch.zeros(3), m)
    with pytest.raises(ValueError, match="policy_average"):
        clip_v_mask(x, torch.zeros(2, 2), x, m)
    with pytest.raises(ValueError, match="moments"):
        clip_b_mask(x, x, m, moments=torch.zeros(2, dtype=torch.float64))

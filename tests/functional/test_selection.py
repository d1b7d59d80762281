"""Exact top-k selection with a global-index tie-break, against a plain-Python sort, whole and sharded."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from lit_entropy.functional.selection import (
    TopKCut,
    kth_largest,
    local_top_scores,
    tie_counts,
    top_k_cut,
    top_k_mask,
)


def ref_top_k(scores: list[list[float]], candidates: list[list[bool]], k: int) -> set[tuple[int, int]]:
    """Sort the candidates by (score descending, row-major index ascending) and take the first k."""
    ranked = sorted(
        (-s, (b, t))
        for b, row in enumerate(scores)
        for t, s in enumerate(row)
        if candidates[b][t] and not math.isnan(s)
    )
    return {bt for _, bt in ranked[:k]}


def _selected(mask: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(b), int(t)) for b, t in torch.nonzero(mask).tolist()}


def _tied_batch(rng: random.Random, rows: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer scores from a tiny range (heavy ties), sometimes all equal, with ragged candidates."""
    levels = rng.choice([1, 2, 3, 5])
    scores = torch.tensor([[float(rng.randrange(levels)) for _ in range(cols)] for _ in range(rows)])
    candidates = torch.tensor([[rng.random() < 0.7 for _ in range(cols)] for _ in range(rows)])
    return scores.double(), candidates


def _sharded_cut(parts: list[tuple[torch.Tensor, torch.Tensor]], k: int) -> list[TopKCut]:
    """The distributed recipe of the module docstring, with the collectives done by hand."""
    threshold = float(kth_largest(torch.cat([local_top_scores(s, c, k) for s, c in parts]), k))
    counts = [tie_counts(s, c, threshold).tolist() for s, c in parts]
    above = sum(a for a, _ in counts)
    return [TopKCut(k, threshold, above, sum(t for _, t in counts[:r])) for r in range(len(parts))]


def test_single_process_matches_sorted_reference_with_heavy_ties():
    rng = random.Random(0)
    tied_at_cut = 0
    for _ in range(300):
        rows, cols = rng.randint(1, 6), rng.randint(1, 12)
        scores, cand = _tied_batch(rng, rows, cols)
        n = int(cand.sum())
        k = rng.randint(0, n + 2)
        got = top_k_mask(scores, cand, top_k_cut(scores, cand, k))
        expected = ref_top_k(scores.tolist(), cand.tolist(), k)
        assert _selected(got) == expected
        assert int(got.sum()) == min(k, n)
        if 0 < k < n:
            kth = sorted(scores[cand].tolist(), reverse=True)[k - 1]
            tied_at_cut += int((scores[cand] == kth).sum()) > 1
    assert tied_at_cut > 100  # the threshold rule would have selected more than k in these


def test_sharded_recipe_selects_what_one_process_selects():
    rng = random.Random(1)
    for _ in range(200):
        rows, cols = rng.randint(2, 9), rng.randint(1, 10)
        scores, cand = _tied_batch(rng, rows, cols)
        k = rng.randint(1, int(cand.sum()) + 2)
        cuts = sorted(rng.sample(range(1, rows), rng.randint(0, min(3, rows - 1))))
        bounds = [0, *cuts, rows]
        parts = [(scores[a:b], cand[a:b]) for a, b in itertools.pairwise(bounds)]
        sharded = torch.cat([top_k_mask(s, c, cut) for (s, c), cut in zip(parts, _sharded_cut(parts, k), strict=True)])
        assert _selected(sharded) == ref_top_k(scores.tolist(), cand.tolist(), k)


def test_all_equal_scores_select_the_first_k_in_row_major_order():
    scores = torch.zeros(3, 4, dtype=torch.float64)
    cand = torch.ones(3, 4, dtype=torch.bool)
    cand[0, 1] = False
    got = top_k_mask(scores, cand, top_k_cut(scores, cand, 3))
    assert _selected(got) == {(0, 0), (0, 2), (0, 3)}
    # Split after row 0: rank 0's three tied tokens come first and fill k, so rank 1 selects none.
    parts = [(scores[:1], cand[:1]), (scores[1:], cand[1:])]
    cut0, cut1 = _sharded_cut(parts, 3)
    assert cut0 == TopKCut(3, 0.0, 0, 0) and cut1 == TopKCut(3, 0.0, 0, 3)
    assert not top_k_mask(scores[1:], cand[1:], cut1).any()


def test_nan_is_never_selected_and_neg_inf_is_the_lowest_score():
    scores = torch.tensor([[math.nan, -math.inf, 1.0, math.nan, -math.inf]], dtype=torch.float64)
    cand = torch.ones_like(scores, dtype=torch.bool)
    assert _selected(top_k_mask(scores, cand, top_k_cut(scores, cand, 2))) == {(0, 2), (0, 1)}
    assert _selected(top_k_mask(scores, cand, top_k_cut(scores, cand, 9))) == {(0, 1), (0, 2), (0, 4)}
    assert local_top_scores(scores, cand, 4).tolist() == [1.0, -math.inf, -math.inf, -math.inf]
    assert not top_k_mask(scores, cand, top_k_cut(scores, cand, 0)).any()


def test_kth_largest_and_local_top_scores():
    vals = torch.tensor([3.0, 1.0, 3.0, 2.0, 5.0])
    assert [kth_largest(vals, k).item() for k in range(1, 6)] == sorted(vals.tolist(), reverse=True)
    assert kth_largest(vals, 6).item() == -math.inf
    scores = torch.tensor([[1.0, 9.0, 4.0], [7.0, 2.0, 8.0]])
    cand = torch.tensor([[True, False, True], [True, True, False]])
    assert local_top_scores(scores, cand, 2).tolist() == [7.0, 4.0]
    assert local_top_scores(scores, cand, 6).tolist() == [7.0, 4.0, 2.0, 1.0, -math.inf, -math.inf]
    with pytest.raises(ValueError, match="k"):
        kth_largest(vals, 0)


def test_bad_arguments_raise():
    scores = torch.zeros(2, 3)
    with pytest.raises(ValueError, match="candidates shape"):
        top_k_cut(scores, torch.ones(3, 2, dtype=torch.bool), 1)
    with pytest.raises(ValueError, match="k must be >= 0"):
        top_k_cut(scores, torch.ones(2, 3, dtype=torch.bool), -1)

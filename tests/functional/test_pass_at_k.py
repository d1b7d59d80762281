"""pass@k / avg@k against brute-force subset enumeration and exact binomials."""

from __future__ import annotations

import itertools
import math
import random
from fractions import Fraction

import pytest
import torch

from lit_entropy.functional.pass_at_k import avg_at_k, pass_at_k, pass_at_k_per_prompt


def _brute_force_pass_at_k(row: list[bool], k: int) -> Fraction:
    """Fraction of all k-subsets of the samples that contain at least one correct sample."""
    subsets = list(itertools.combinations(range(len(row)), k))
    hits = sum(any(row[i] for i in subset) for subset in subsets)
    return Fraction(hits, len(subsets))


def _exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


@pytest.mark.parametrize("n", range(1, 8))
def test_matches_brute_force_enumeration_all_small_cases(n: int) -> None:
    rng = random.Random(n)
    for c in range(n + 1):
        # Where the correct samples sit must not matter; shuffle to check that too.
        row = [True] * c + [False] * (n - c)
        rng.shuffle(row)
        for k in range(1, n + 1):
            expected = _brute_force_pass_at_k(row, k)
            got = pass_at_k(torch.tensor([row]), k)
            assert got.dtype == torch.float64 and got.ndim == 0
            assert got.item() == pytest.approx(float(expected), abs=1e-14), (n, c, k)
            if n - c < k:
                assert got.item() == 1.0, (n, c, k)


@pytest.mark.parametrize("n", range(1, 8))
def test_mean_over_prompts_matches_brute_force(n: int) -> None:
    # Every c in one matrix: the result is the plain mean of the per-row brute-force values.
    rows = [[j < c for j in range(n)] for c in range(n + 1)]
    for k in range(1, n + 1):
        expected = sum(_brute_force_pass_at_k(row, k) for row in rows) / len(rows)
        assert pass_at_k(torch.tensor(rows), k).item() == pytest.approx(float(expected), abs=1e-14)


@pytest.mark.parametrize(
    ("n", "c", "k"), [(1000, 3, 100), (1000, 0, 100), (1000, 1, 1), (1000, 900, 100), (500, 37, 250)]
)
def test_large_n_matches_math_comb(n: int, c: int, k: int) -> None:
    row = torch.zeros(1, n, dtype=torch.bool)
    row[0, torch.randperm(n, generator=torch.Generator().manual_seed(0))[:c]] = True
    expected = float(_exact_pass_at_k(n, c, k))
    assert pass_at_k(row, k).item() == pytest.approx(expected, rel=1e-12, abs=1e-15)


def test_large_n_reference_value() -> None:
    # 1 - C(997, 100) / C(1000, 100) = 1 - (900 * 899 * 898) / (1000 * 999 * 998), written out by hand.
    correct = torch.zeros(1, 1000, dtype=torch.bool)
    correct[0, :3] = True
    expected = 1 - (900 * 899 * 898) / (1000 * 999 * 998)
    assert pass_at_k(correct, 100).item() == pytest.approx(expected, rel=1e-13)


def test_avg_at_k_is_pass_at_1_and_mean_fraction() -> None:
    gen = torch.Generator().manual_seed(1)
    for num_prompts, n in [(1, 1), (5, 4), (17, 8), (3, 16)]:
        correct = torch.rand(num_prompts, n, generator=gen) < 0.4
        rows = correct.tolist()
        expected = sum(sum(row) / n for row in rows) / num_prompts
        got = avg_at_k(correct)
        assert got.dtype == torch.float64
        assert got.item() == pytest.approx(expected, abs=1e-14)
        assert pass_at_k(correct, 1).item() == pytest.approx(expected, abs=1e-14)


def test_random_bool_matrices_against_math_comb() -> None:
    gen = torch.Generator().manual_seed(2)
    for trial in range(20):
        num_prompts = 1 + trial % 6
        n = 1 + (trial * 7) % 24
        correct = torch.rand(num_prompts, n, generator=gen) < (trial % 5) / 4
        for k in sorted({1, max(1, n // 3), n}):
            expected = sum(float(_exact_pass_at_k(n, sum(row), k)) for row in correct.tolist()) / num_prompts
            assert pass_at_k(correct, k).item() == pytest.approx(expected, abs=1e-13), (trial, k)


def test_integer_zero_one_input_equals_bool() -> None:
    correct = torch.tensor([[1, 0, 0], [1, 1, 0]])
    assert pass_at_k(correct, 2).item() == pytest.approx(float((_exact_pass_at_k(3, 1, 2) + 1) / 2))
    assert avg_at_k(correct).item() == pytest.approx(0.5)


def test_per_prompt_ragged_groups() -> None:
    rng = random.Random(3)
    n_list = [rng.randint(4, 40) for _ in range(30)]
    c_list = [rng.randint(0, n) for n in n_list]
    k = 4
    got = pass_at_k_per_prompt(torch.tensor(c_list), torch.tensor(n_list), k)
    assert got.dtype == torch.float64 and got.shape == (30,)
    for value, n, c in zip(got.tolist(), n_list, c_list, strict=True):
        assert value == pytest.approx(float(_exact_pass_at_k(n, c, k)), abs=1e-14), (n, c)


def test_per_prompt_empty() -> None:
    got = pass_at_k_per_prompt(torch.zeros(0, dtype=torch.long), torch.zeros(0, dtype=torch.long), 3)
    assert got.shape == (0,) and got.dtype == torch.float64


@pytest.mark.parametrize(("n", "k"), [(3, 4), (1, 2), (0, 1)])
def test_k_greater_than_n_raises_naming_k_and_n(n: int, k: int) -> None:
    with pytest.raises(ValueError, match=rf"k={k}.*n={n}"):
        pass_at_k(torch.ones(2, n, dtype=torch.bool), k)
    with pytest.raises(ValueError, match=rf"k={k}.*n={n}"):
        pass_at_k_per_prompt(torch.tensor([0, 0]), torch.tensor([n + 1, n]), k)


@pytest.mark.parametrize("k", [0, -1, 1.0, True, "2"])
def test_bad_k_raises(k: object) -> None:
    with pytest.raises(ValueError, match="k="):
        pass_at_k(torch.ones(2, 3, dtype=torch.bool), k)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "correct",
    [
        torch.ones(4, dtype=torch.bool),
        torch.ones(2, 3, 4, dtype=torch.bool),
        torch.ones(2, 3),
        torch.tensor([[0, 2, 1]]),
        torch.ones(0, 3, dtype=torch.bool),
    ],
)
def test_bad_correct_raises(correct: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="correct"):
        pass_at_k(correct, 1)
    with pytest.raises(ValueError, match="correct"):
        avg_at_k(correct)


def test_bad_counts_raise() -> None:
    with pytest.raises(ValueError, match="num_correct=5"):
        pass_at_k_per_prompt(torch.tensor([1, 5]), torch.tensor([4, 4]), 2)
    with pytest.raises(ValueError, match="num_correct"):
        pass_at_k_per_prompt(torch.tensor([-1]), torch.tensor([4]), 2)
    with pytest.raises(ValueError, match="shape"):
        pass_at_k_per_prompt(torch.tensor([1, 2]), torch.tensor([4]), 2)
    with pytest.raises(ValueError, match="integer"):
        pass_at_k_per_prompt(torch.tensor([1.0]), torch.tensor([4]), 2)

"""Statistics of issue 39's decision rule (experiment E, ``experiments/sod_robust/PREREGISTRATION.md``).

* :func:`holm`: Holm's step-down adjustment of a family of p-values.
* :func:`sign_flip_p`: the exact two-sided sign-flip p-value for any n (``scripts.studies.statistics``
  enumerates at most 2^20 assignments; E pools 24 units), counted by splitting the differences in two halves.
* :func:`corrected_verdict`: better / worse / none / small, consistent / inconclusive from a family's
  Bonferroni interval and the Holm-adjusted p.

Pure arithmetic on floats: no torch, no Lightning.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Sequence

__all__ = ["corrected_verdict", "family_level", "holm", "sign_flip_p"]


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order.

    With the m p-values sorted ``p_(1) <= ... <= p_(m)``, the adjusted ``p_(i) = max_{j <= i} min(1, (m - j + 1)
    p_(j))``; rejecting where the adjusted p < alpha controls the family-wise error rate at alpha.

    >>> holm([0.01, 0.04, 0.03])
    [0.03, 0.06, 0.06]
    """
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = round(running, 15)  # 3 * 0.01 = 0.030000000000000002: keep the doctest readable
    return adjusted


def family_level(m: int, alpha: float = 0.05) -> float:
    """Confidence level of each Bonferroni interval in a family of m (all m cover at once with >= 1 - alpha)."""
    if m < 1:
        raise ValueError(f"a family has at least one test, got m={m}")
    return 1.0 - alpha / m


def _subset_sums(values: Sequence[float]) -> list[float]:
    sums = [0.0]
    for v in values:
        sums = [s + v for s in sums] + [s - v for s in sums]
    return sums


def sign_flip_p(differences: Sequence[float]) -> float:
    """Exact two-sided sign-flip p-value: the share of the 2^n sign assignments of ``|d_i|`` whose sum is at
    least as far from 0 as the observed sum (observed included, so p >= 2^-n).

    The sums of the first half's assignments are sorted, and for each sum of the second half the partners that
    make the total extreme are counted by bisection: 2 x 2^(n/2) sums instead of 2^n. Near-ties count as ties
    (tolerance 1e-9 of the sum of |d_i|), as in ``scripts.studies.statistics.sign_flip_test``.

    >>> sign_flip_p([0.1, 0.2, 0.3])  # all positive: 2 of the 8 assignments are as extreme
    0.25
    """
    mags = [abs(float(d)) for d in differences]
    if not mags:
        return math.nan
    half = len(mags) // 2
    left = sorted(_subset_sums(mags[:half]))
    right = _subset_sums(mags[half:])
    tol = 1e-9 * max(math.fsum(mags), 1e-300)
    threshold = abs(math.fsum(float(d) for d in differences)) - tol
    if threshold <= 0:
        return 1.0
    extreme = 0
    for r in right:  # |l + r| >= threshold  <=>  l >= threshold - r  or  l <= -threshold - r (disjoint)
        extreme += len(left) - bisect_left(left, threshold - r)
        extreme += bisect_right(left, -threshold - r)
    return extreme / (len(left) * len(right))


def corrected_verdict(low: float, high: float, mean: float, p_adjusted: float, delta: float) -> str:
    """Issue 39's rule, given the family's Bonferroni interval [low, high] and the Holm-adjusted p.

    better / worse: the interval excludes 0, |mean| >= delta and p < 0.05; none: the interval lies inside
    [-delta, +delta]; small, consistent (positive / negative): the interval excludes 0 and p < 0.05, but
    |mean| < delta and the interval reaches beyond the floor; inconclusive: anything else.
    """
    if any(math.isnan(x) for x in (low, high, mean, p_adjusted)):
        return "inconclusive"
    excludes_zero = low > 0 or high < 0
    if excludes_zero and abs(mean) >= delta and p_adjusted < 0.05:
        return "better" if mean > 0 else "worse"
    if -delta <= low and high <= delta:
        return "none"
    if excludes_zero and p_adjusted < 0.05:
        return "small, consistent " + ("positive" if mean > 0 else "negative")
    return "inconclusive"

"""scripts.studies.statistics (the study statistics) against independent references: printed t tables, closed-form
t CDFs, the normal limit, NumPy's percentile and brute-force enumeration of sign assignments."""

from __future__ import annotations

import itertools
import math
import random
import statistics as stdlib_statistics

import numpy as np
import pytest

from scripts.studies.statistics import (
    SIGN_FLIP_MAX_N,
    Interval,
    bootstrap_interval,
    paired_t_interval,
    percentile,
    sign_flip_test,
    t_cdf,
    t_interval,
    t_quantile,
)

# Two-sided critical values of a printed Student-t table (upper-tail probability q, df, value to 3 decimals).
T_TABLE = [
    (0.975, 1, 12.706),
    (0.995, 1, 63.657),
    (0.975, 2, 4.303),
    (0.95, 5, 2.015),
    (0.975, 4, 2.776),
    (0.95, 9, 1.833),
    (0.975, 10, 2.228),
    (0.9, 20, 1.325),
    (0.975, 30, 2.042),
    (0.995, 30, 2.750),
    (0.975, 120, 1.980),
]


@pytest.mark.parametrize(("q", "df", "table"), T_TABLE)
def test_t_quantile_matches_the_printed_table(q, df, table):
    assert t_quantile(q, df) == pytest.approx(table, abs=5e-4)
    assert t_quantile(1 - q, df) == pytest.approx(-table, abs=5e-4)


def _cauchy_cdf(x: float) -> float:
    return 0.5 + math.atan(x) / math.pi


def _t2_cdf(x: float) -> float:
    return 0.5 + x / (2 * math.sqrt(2 + x * x))


def _t3_cdf(x: float) -> float:
    u = x / math.sqrt(3)
    return 0.5 + (u / (1 + u * u) + math.atan(u)) / math.pi


@pytest.mark.parametrize(("df", "closed_form"), [(1, _cauchy_cdf), (2, _t2_cdf), (3, _t3_cdf)])
@pytest.mark.parametrize("x", [-7.5, -2.0, -0.3, 0.0, 1e-6, 0.8, 4.0])
def test_t_cdf_matches_closed_forms(df, closed_form, x):
    assert t_cdf(x, df) == pytest.approx(closed_form(x), rel=1e-12, abs=1e-15)


def test_t_cdf_far_tail_keeps_relative_accuracy():
    # Cauchy: P(T < -x) = atan(1/x) / pi, computed without cancellation.
    for x in (1e3, 1e6, 1e9):
        assert t_cdf(-x, 1) == pytest.approx(math.atan(1 / x) / math.pi, rel=1e-12)
    # Near the centre the difference from 1/2 is resolved too (Cauchy: atan(x)/pi ~ x/pi).
    assert t_cdf(1e-9, 1) - 0.5 == pytest.approx(1e-9 / math.pi, rel=1e-6)
    assert t_cdf(math.inf, 4) == 1.0 and t_cdf(-math.inf, 4) == 0.0
    assert math.isnan(t_cdf(math.nan, 4))


def test_t_quantile_tends_to_the_normal_quantile():
    normal = stdlib_statistics.NormalDist()
    for q in (0.6, 0.975, 0.999):
        assert t_quantile(q, 1e8) == pytest.approx(normal.inv_cdf(q), rel=1e-6)


def test_t_quantile_far_tail_and_centre():
    # Cauchy quantile tan(pi (q - 1/2)), written as -cot(pi q) in the lower tail (no cancellation there).
    assert t_quantile(1e-9, 1) == pytest.approx(-1 / math.tan(math.pi * 1e-9), rel=1e-9)
    for q in (0.25, 0.5 + 1e-9, 0.999):
        assert t_quantile(q, 1) == pytest.approx(math.tan(math.pi * (q - 0.5)), rel=1e-9)
    assert t_quantile(0.5, 7) == 0.0


@pytest.mark.parametrize(("q", "df", "match"), [(0.0, 3, "0 < q < 1"), (1.0, 3, "0 < q < 1"), (0.9, 0, "df > 0")])
def test_t_quantile_refuses_bad_arguments(q, df, match):
    with pytest.raises(ValueError, match=match):
        t_quantile(q, df)
    with pytest.raises(ValueError, match="df > 0"):
        t_cdf(1.0, math.nan)


def test_t_interval_against_hand_values():
    # mean 2, sd 1, n 3: half width t_{0.975,2} / sqrt(3) = 4.30265 / 1.73205
    interval = t_interval([1.0, 2.0, 3.0])
    assert isinstance(interval, Interval) and (interval.n, interval.level) == (3, 0.95)
    mean, lo, hi = interval
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0 - 2.48414, 2.0 + 2.48414), abs=1e-4)
    # n 5, sd sqrt(2.5), 90 %: t_{0.95,4} = 2.1318
    assert t_interval([0.0, 1.0, 2.0, 3.0, 4.0], level=0.9).high == pytest.approx(2.0 + 2.1318 * 0.5**0.5, abs=1e-4)
    assert interval.excludes(-1.0) and not interval.excludes(0.0)
    assert interval.as_dict() == {"mean": mean, "ci_low": lo, "ci_high": hi}


def test_t_interval_of_fewer_than_two_values_has_nan_bounds():
    one = t_interval([0.5])
    assert one.estimate == 0.5 and math.isnan(one.low) and math.isnan(one.high) and one.n == 1
    assert not one.excludes(0.0)
    assert all(math.isnan(v) for v in t_interval([]))
    with pytest.raises(ValueError, match="level"):
        t_interval([1.0, 2.0], level=1.0)


def test_t_interval_covers_the_mean_at_its_level():
    # Normal samples of 4: the 90 % interval covers the true mean in ~90 % of 4000 draws (binomial sd 0.5 %).
    rng = random.Random(0)
    covered = sum(
        t_interval([rng.gauss(3.0, 2.0) for _ in range(4)], level=0.9).excludes(3.0) is False for _ in range(4000)
    )
    assert covered / 4000 == pytest.approx(0.9, abs=0.02)


def test_paired_t_interval_is_the_interval_of_differences():
    treated, control = [1.0, 4.0, 2.0, 7.0], [0.5, 3.0, 2.5, 5.0]
    diffs = [0.5, 1.0, -0.5, 2.0]  # mean 0.75, sample sd sqrt(1.1875)
    mean, lo, hi = paired_t_interval(treated, control)
    half = 3.18245 * math.sqrt(np.var(diffs, ddof=1)) / 2
    assert (mean, lo, hi) == pytest.approx((0.75, 0.75 - half, 0.75 + half), abs=1e-4)
    with pytest.raises(ValueError, match="as many treated as control"):
        paired_t_interval([1.0, 2.0], [1.0])


def test_percentile_matches_numpy():
    rng = np.random.default_rng(1)
    values = rng.normal(size=37)
    for q in (0.0, 2.5, 25.0, 50.0, 97.5, 100.0):
        assert percentile(values.tolist(), q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)
    assert math.isnan(percentile([], 50.0))
    with pytest.raises(ValueError, match="0 <= q <= 100"):
        percentile([1.0], 101.0)


def test_bootstrap_interval_takes_the_percentiles_of_the_replicates():
    replicates = list(range(1, 41))  # 2.5 % at position 0.975, 97.5 % at position 38.025
    interval = bootstrap_interval(20.0, replicates, n=12)
    assert (interval.estimate, interval.low, interval.high, interval.n) == pytest.approx((20.0, 1.975, 39.025, 12))


def _brute_force_p(differences, alternative):
    observed = sum(differences)
    hits = 0
    for signs in itertools.product((1, -1), repeat=len(differences)):
        s = sum(sign * abs(d) for sign, d in zip(signs, differences, strict=True))
        if alternative == "two-sided":
            hits += abs(s) >= abs(observed) - 1e-12
        elif alternative == "greater":
            hits += s >= observed - 1e-12
        else:
            hits += s <= observed + 1e-12
    return hits / 2 ** len(differences)


@pytest.mark.parametrize("alternative", ["two-sided", "greater", "less"])
def test_sign_flip_test_matches_brute_force_enumeration(alternative):
    rng = random.Random(3)
    for n in (1, 2, 5, 9):
        diffs = [rng.gauss(0.4, 1.0) for _ in range(n)]
        assert sign_flip_test(diffs, alternative) == pytest.approx(_brute_force_p(diffs, alternative))


def test_sign_flip_test_counts_ties_and_the_observed_assignment():
    assert sign_flip_test([1.0, 1.0, 1.0]) == 2 / 8  # only all-plus and all-minus reach |sum| = 3
    assert sign_flip_test([1.0, 1.0, 1.0], "greater") == 1 / 8  # the observed assignment always counts
    # The observed sum 0.1 + 0.2 - 0.3 is 5.6e-17 in float64, and the two assignments with sum 0 round to
    # other tiny values: near-ties still count as ties, so every assignment is as extreme.
    assert sign_flip_test([0.1, 0.2, -0.3]) == 1.0
    assert sign_flip_test([0.0, 0.0]) == 1.0
    assert math.isnan(sign_flip_test([]))


def test_sign_flip_test_refuses_bad_arguments():
    with pytest.raises(ValueError, match=f"n <= {SIGN_FLIP_MAX_N}, got n={SIGN_FLIP_MAX_N + 1}"):
        sign_flip_test([1.0] * (SIGN_FLIP_MAX_N + 1))
    with pytest.raises(ValueError, match="alternative"):
        sign_flip_test([1.0], "both")

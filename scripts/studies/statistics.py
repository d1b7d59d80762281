"""Small-sample statistics for reports and benchmarks: Student-t intervals, bootstrap percentile intervals and
the exact sign-flip test. Pure Python (no SciPy, no NumPy), float64 throughout.

Conventions shared by every helper here:

- An interval is an :class:`Interval` (point estimate, bounds, sample size, level). It unpacks as
  ``estimate, low, high = interval``, so callers that want the three numbers need not know the class.
- Too few values is not an error: a t interval of fewer than two values has NaN bounds (and a NaN estimate
  for no values), a sign-flip test of no values has a NaN p-value. Reports print such cells as ``nan``
  instead of crashing a long run at its last line.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

__all__ = [
    "Interval",
    "bootstrap_interval",
    "paired_t_interval",
    "percentile",
    "sign_flip_test",
    "t_cdf",
    "t_interval",
    "t_quantile",
]

#: Largest sample the exact sign-flip test enumerates (2^20 ~ 1e6 sign assignments).
SIGN_FLIP_MAX_N = 20


@dataclass(frozen=True)
class Interval:
    """A point estimate with a two-sided confidence interval.

    Attributes:
        estimate: the point estimate (a mean, a mean difference, a bootstrap's full-sample statistic).
        low: lower bound (NaN when it cannot be formed, e.g. from fewer than two values).
        high: upper bound (NaN likewise).
        n: the number of values (or pairs) the interval is formed from.
        level: the coverage, e.g. 0.95.
    """

    estimate: float
    low: float
    high: float
    n: int
    level: float

    def __iter__(self) -> Iterator[float]:
        """Unpack as ``estimate, low, high``."""
        return iter((self.estimate, self.low, self.high))

    def excludes(self, value: float = 0.0) -> bool:
        """Whether ``value`` lies outside ``[low, high]`` (False when a bound is NaN)."""
        return bool(self.low > value or self.high < value)

    def as_dict(self) -> dict[str, float]:
        """``{"mean", "ci_low", "ci_high"}``, the keys benchmark JSON files use."""
        return {"mean": self.estimate, "ci_low": self.low, "ci_high": self.high}


def _check_level(level: float) -> None:
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie in (0, 1), got {level}")


def _check_df(df: float) -> None:
    if not (df > 0):  # also refuses NaN
        raise ValueError(f"Student's t needs degrees of freedom df > 0, got df={df}")


def _beta_continued_fraction(a: float, b: float, x: float) -> float:
    """Continued fraction of the regularized incomplete beta function (modified Lentz), for x < (a+1)/(a+b+2)."""
    tiny, eps = 1e-300, 1e-16
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            return h
    raise ArithmeticError(f"incomplete beta continued fraction did not converge for a={a}, b={b}, x={x}")


def _regularized_beta(a: float, b: float, x: float, y: float) -> float:
    """``I_x(a, b)``, the regularized incomplete beta function, for ``0 <= x <= 1`` and ``y = 1 - x``.

    The caller passes ``y`` computed without cancellation (``1 - x`` loses digits when ``x`` is near 1).
    """
    if x <= 0.0:
        return 0.0
    if y <= 0.0:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(y)
    # The continued fraction converges fast only below the mean-ish point; use the symmetry I_x(a,b) = 1 - I_y(b,a).
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_continued_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_continued_fraction(b, a, y) / b


def _t_tail(x: float, df: float) -> float:
    """``P(T > |x|)`` for Student's t with ``df`` degrees of freedom, accurate in the tail and near the centre."""
    if math.isinf(x):
        return 0.0
    x2 = x * x
    far, near = df / (df + x2), x2 / (df + x2)  # both without cancellation: they sum to 1
    if far < near:  # tail: P(T > |x|) = I_far(df/2, 1/2) / 2 is small and accurate
        return 0.5 * _regularized_beta(df / 2.0, 0.5, far, near)
    # centre: P(|T| < |x|) = I_near(1/2, df/2) is small, so compute it and subtract from 1/2
    return 0.5 - 0.5 * _regularized_beta(0.5, df / 2.0, near, far)


def t_cdf(x: float, df: float) -> float:
    """Cumulative distribution function of Student's t.

    Args:
        x: the point (any real, +-inf allowed).
        df: degrees of freedom, > 0 (real; 1 is the Cauchy distribution).

    Returns:
        ``P(T <= x)``, from the regularized incomplete beta function
        ``P(T > |x|) = I_{df/(df+x^2)}(df/2, 1/2) / 2`` (relative accuracy ~1e-14 in both tails).
    """
    _check_df(df)
    if math.isnan(x):
        return math.nan
    tail = _t_tail(x, df)
    return tail if x < 0 else 1.0 - tail


@functools.lru_cache(maxsize=1024)  # reports ask for the same few (level, df) pairs many times
def t_quantile(q: float, df: float) -> float:
    """Quantile function of Student's t: the ``x`` with ``t_cdf(x, df) == q``.

    Args:
        q: probability in (0, 1).
        df: degrees of freedom, > 0.

    Returns:
        The quantile, found by bisection on the upper tail probability (monotone, so it cannot miss) to the
        float64 resolution of ``x``; the symmetric lower half follows from ``t_quantile(1-q) = -t_quantile(q)``.
    """
    _check_df(df)
    if not (0.0 < q < 1.0):
        raise ValueError(f"t_quantile needs a probability 0 < q < 1, got q={q}")
    if q == 0.5:
        return 0.0
    tail = min(q, 1.0 - q)  # P(T > x) for the positive quantile x
    low, high = 0.0, 1.0
    while _t_tail(high, df) > tail:
        low, high = high, 2.0 * high
    for _ in range(200):  # the bracket halves each time: float64 resolution long before 200 rounds
        mid = 0.5 * (low + high)
        if mid in (low, high):
            break
        low, high = (mid, high) if _t_tail(mid, df) > tail else (low, mid)
    x = 0.5 * (low + high)
    return x if q > 0.5 else -x


def _mean_and_sd(values: Sequence[float]) -> tuple[float, float]:
    n = len(values)
    mean = math.fsum(values) / n
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def t_interval(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of ``values`` and its two-sided Student-t confidence interval.

    ``mean +- t_{(1+level)/2, n-1} * sd / sqrt(n)`` with the sample standard deviation (``n - 1`` in the
    denominator). Fewer than two values give NaN bounds (one value: its mean; none: a NaN mean).
    """
    _check_level(level)
    values = [float(v) for v in values]
    n = len(values)
    if n < 2:
        return Interval(values[0] if n else math.nan, math.nan, math.nan, n, level)
    mean, sd = _mean_and_sd(values)
    half = t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n, level)


def paired_t_interval(treated: Sequence[float], control: Sequence[float], level: float = 0.95) -> Interval:
    """Mean of the paired differences ``treated[i] - control[i]`` and its Student-t interval.

    Pairs share a seed, a round or a rotation cycle, so their difference cancels what they have in common.
    ``n`` counts pairs; fewer than two pairs give NaN bounds as in :func:`t_interval`.
    """
    if len(treated) != len(control):
        raise ValueError(
            f"paired_t_interval needs as many treated as control values, got {len(treated)} and {len(control)}"
        )
    return t_interval([float(a) - float(b) for a, b in zip(treated, control, strict=True)], level)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0..100) of ``values`` with linear interpolation between order statistics
    (NumPy's default ``linear`` method: position ``q/100 * (n - 1)`` in the sorted values)."""
    if not (0.0 <= q <= 100.0):
        raise ValueError(f"percentile needs 0 <= q <= 100, got q={q}")
    ordered = sorted(float(v) for v in values)
    if not ordered:
        return math.nan
    position = q / 100.0 * (len(ordered) - 1)
    below = math.floor(position)
    above = min(below + 1, len(ordered) - 1)
    return ordered[below] + (position - below) * (ordered[above] - ordered[below])


def bootstrap_interval(estimate: float, replicates: Sequence[float], level: float = 0.95, n: int = 0) -> Interval:
    """Percentile bootstrap interval: the ``(1-level)/2`` and ``(1+level)/2`` percentiles of the statistic's
    bootstrap ``replicates`` around its full-sample ``estimate``; ``n`` is the sample size the caller resampled
    (for the record). No replicates give NaN bounds."""
    _check_level(level)
    tail = 50.0 * (1.0 - level)
    return Interval(float(estimate), percentile(replicates, tail), percentile(replicates, 100.0 - tail), n, level)


def sign_flip_test(differences: Sequence[float], alternative: str = "two-sided") -> float:
    """Exact sign-flip (paired permutation) test that the paired differences are centred on zero.

    Under the null hypothesis each difference is as likely to carry either sign, so all ``2^n`` sign
    assignments of ``|d_i|`` are equally likely. The p-value is the fraction of them whose sum is at least
    as extreme as the observed sum (the observed assignment included, so ``p >= 2^-n``).

    Args:
        differences: paired differences ``d_i``, at most :data:`SIGN_FLIP_MAX_N` of them.
        alternative: ``"two-sided"`` (``|sum| >= |observed|``), ``"greater"`` (``sum >= observed``) or
            ``"less"`` (``sum <= observed``).

    Returns:
        The exact p-value; NaN for no differences.
    """
    if alternative not in ("two-sided", "greater", "less"):
        raise ValueError(f"alternative must be 'two-sided', 'greater' or 'less', got {alternative!r}")
    values = [float(d) for d in differences]
    if len(values) > SIGN_FLIP_MAX_N:
        raise ValueError(f"sign_flip_test enumerates 2^n sign assignments: n <= {SIGN_FLIP_MAX_N}, got n={len(values)}")
    if not values:
        return math.nan
    sums = [0.0]
    for d in values:  # every subset sum of +-|d_i|: the list doubles per value
        sums = [s + abs(d) for s in sums] + [s - abs(d) for s in sums]
    observed = math.fsum(values)
    # Sums of the same magnitudes in another order differ by rounding: count near-ties as ties.
    tol = 1e-9 * max(math.fsum(abs(d) for d in values), 1e-300)
    if alternative == "two-sided":
        extreme = sum(abs(s) >= abs(observed) - tol for s in sums)
    elif alternative == "greater":
        extreme = sum(s >= observed - tol for s in sums)
    else:
        extreme = sum(s <= observed + tol for s in sums)
    return extreme / len(sums)

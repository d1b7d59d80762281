"""Every bad argument of every token callback is refused at construction, as its functional math refuses it.

Each case names the argument, a bad value and the exact message (argument, value, what is allowed). Where
the callback's math lives in :mod:`lit_entropy.functional`, the same value passed to that function raises
the same message: the constructor and the math call one ``check_*`` function, so they cannot disagree.
"""

from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch
from _token_callbacks import CLASSES

from lit_entropy.callbacks import (
    REPOR,
    STARE,
    AdaptiveEntropyBonus,
    AdvantageReweighting,
    ClipCov,
    Entrocraft,
    EntropyDiscriminatorClipping,
    EntropyDynamicsMonitor,
    HighEntropySelection,
    KLCov,
    RandomNegativeMasking,
    SpuriousTokenSilencing,
    UnlikelinessReward,
)
from lit_entropy.functional.control import (
    entrocraft_advantages,
    entrocraft_bounds,
    reweighted_advantages,
    s2t_mask,
    stare_weights,
    unlikeliness_advantages,
)
from lit_entropy.functional.entropy import adaptive_entropy_coef
from lit_entropy.functional.selection import (
    cap_count,
    clip_b_mask,
    clip_cov_mask,
    clip_v_mask,
    high_entropy_mask,
    kl_cov_coefficients,
)

_GEN = torch.Generator().manual_seed(0)
_S = torch.randn(3, 5, generator=_GEN, dtype=torch.float64)
_AVG = 0.1 * torch.randn(3, 5, generator=_GEN, dtype=torch.float64)
_ADV = torch.tensor([[1.0], [-1.0], [0.5]], dtype=torch.float64).expand(3, 5)
_MASK = torch.ones(3, 5, dtype=torch.bool)


def _clip_b(kw: dict[str, Any]) -> None:
    clip_b_mask(_S, _ADV, _MASK, mu=kw.get("mu", 2.5), symmetric=kw.get("symmetric", False))


def _clip_v(kw: dict[str, Any]) -> None:
    options = {k: kw[k] for k in ("mu", "max_frac", "symmetric") if k in kw}
    clip_v_mask(_S, _AVG, _ADV, _MASK, **options)


def _clip_cov(kw: dict[str, Any]) -> None:
    names = {"clip_cov_ratio": "ratio", "clip_cov_lb": "lb", "clip_cov_ub": "ub"}
    clip_cov_mask(_ADV, _S, _MASK, **{names[k]: v for k, v in kw.items() if k in names})


def _kl_cov(kw: dict[str, Any]) -> None:
    names = {"kl_cov_ratio": "ratio", "ppo_kl_coef": "coef"}
    kl_cov_coefficients(_ADV, _S, _MASK, **{names[k]: v for k, v in kw.items() if k in names})


def _high_entropy(kw: dict[str, Any]) -> None:
    high_entropy_mask(_S.abs(), _MASK, rho=kw["rho"])


def _adaptive(kw: dict[str, Any]) -> None:
    defaults = {"entropy_target": 0.2, "coef_delta": 1e-3, "coef_min": 0.0, "coef_max": 0.05}
    adaptive_entropy_coef(0.0, 0.1, **{**defaults, **{k: v for k, v in kw.items() if k in defaults}})


def _stare(kw: dict[str, Any]) -> None:
    names = ("top_ratio", "reweight_w", "reweight_m", "variant")
    stare_weights(_S, _ADV, _MASK, **{k: v for k, v in kw.items() if k in names})


def _entrocraft(kw: dict[str, Any]) -> None:
    if "schedule" in kw:
        entrocraft_bounds(1, 10, schedule=kw["schedule"])
    if "signal" in kw:
        entrocraft_advantages(_ADV, _ADV[:, 0], _MASK, "positive", signal=kw["signal"])


def _s2t(kw: dict[str, Any]) -> None:
    s2t_mask(_S, _S.abs(), _ADV, _MASK, **kw)


def _reweighting(kw: dict[str, Any]) -> None:
    reweighted_advantages(_ADV, _S, _MASK, **kw)


def _unlikeliness(kw: dict[str, Any]) -> None:
    unlikeliness_advantages(_ADV[:, 0], _S, _MASK, group_size=3, **kw)


class Case(NamedTuple):
    make: Callable[..., Any]
    kwargs: dict[str, Any]
    message: str
    math: Callable[[dict[str, Any]], None] | None  # the functional counterpart, None where there is none


_POSITIVE = [(math.inf, "inf"), (math.nan, "nan"), (0, "0"), (-1.0, "-1.0"), ("2.5", "'2.5'"), (True, "True")]
_SHARE = [(0, "0"), (-0.1, "-0.1"), (1.5, "1.5"), (math.inf, "inf"), (math.nan, "nan"), ("0.1", "'0.1'")]
_FLAG = [("yes", "'yes'"), (1, "1"), (None, "None")]
_SEED = [(-1, "-1"), (1.5, "1.5"), (True, "True"), (2**32, "4294967296"), ("0", "'0'")]
_PREFIX = [("", "''"), ("train/x/", "'train/x/'"), (3, "3"), ("/", "'/'")]


def _cases() -> list[tuple[str, Case]]:
    cases: list[tuple[str, Case]] = []

    def add(name: str, make: Callable[..., Any], kwargs: dict[str, Any], message: str, fn=None) -> None:
        cases.append((f"{name}-{'-'.join(f'{k}={v!r}' for k, v in kwargs.items())}", Case(make, kwargs, message, fn)))

    clip = EntropyDiscriminatorClipping
    for method, fn in (("clip_b", _clip_b), ("clip_v", _clip_v)):
        for value, shown in _POSITIVE:
            add(method, clip, {"method": method, "mu": value}, f"mu must be a finite number > 0, got {shown}", fn)
        for value, shown in _FLAG:
            add(
                method,
                clip,
                {"method": method, "symmetric": value},
                f"symmetric must be true or false, got {shown}",
                fn,
            )
        for value, shown in _SHARE:
            message = f"max_frac must be a number in (0, 1] or null, got {shown}"
            add(method, clip, {"method": method, "max_frac": value}, message, _clip_v)
    add("clip", clip, {"method": "clip_x"}, "method must be one of ('clip_b', 'clip_v'), got 'clip_x'")
    add("clip", clip, {"method": None}, "method must be one of ('clip_b', 'clip_v'), got None")

    for value, shown in _POSITIVE:
        add("random", RandomNegativeMasking, {"mu": value}, f"mu must be a finite number > 0, got {shown}", _clip_b)
    for value, shown in _SEED:
        add(
            "random", RandomNegativeMasking, {"seed": value}, f"seed must be an integer in [0, 4294967295], got {shown}"
        )

    for value, shown in _SHARE:
        message = f"clip_cov_ratio must be a number in (0, 1], got {shown}"
        add("clip_cov", ClipCov, {"clip_cov_ratio": value}, message, _clip_cov)
        add("kl_cov", KLCov, {"kl_cov_ratio": value}, f"kl_cov_ratio must be a number in (0, 1], got {shown}", _kl_cov)
        add(
            "high_entropy",
            HighEntropySelection,
            {"rho": value},
            f"rho must be a number in (0, 1], got {shown}",
            _high_entropy,
        )
    for bound in ("clip_cov_lb", "clip_cov_ub"):
        for value, shown in [(math.inf, "inf"), (-math.inf, "-inf"), (math.nan, "nan"), ("1", "'1'")]:
            add("clip_cov", ClipCov, {bound: value}, f"{bound} must be a finite number, got {shown}", _clip_cov)
    for lb, ub in ((5.0, 1.0), (2.0, 2.0)):
        window = "an empty covariance window selects nothing"
        message = f"clip_cov_lb must be < clip_cov_ub ({window}), got clip_cov_lb={lb}, clip_cov_ub={ub}"
        add("clip_cov", ClipCov, {"clip_cov_lb": lb, "clip_cov_ub": ub}, message, _clip_cov)
    for value, shown in _SEED:
        add("clip_cov", ClipCov, {"seed": value}, f"seed must be an integer in [0, 4294967295], got {shown}")
    for value, shown in [(-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan"), (None, "None")]:
        add("kl_cov", KLCov, {"ppo_kl_coef": value}, f"ppo_kl_coef must be a finite number >= 0, got {shown}", _kl_cov)

    bonus = AdaptiveEntropyBonus
    for name in ("entropy_target", "coef_delta"):
        for value, shown in _POSITIVE:
            add("adaptive", bonus, {name: value}, f"{name} must be a finite number > 0, got {shown}", _adaptive)
    for name in ("coef_min", "coef_max"):
        for value, shown in [(-0.1, "-0.1"), (math.inf, "inf"), (math.nan, "nan")]:
            add("adaptive", bonus, {name: value}, f"{name} must be a finite number >= 0, got {shown}", _adaptive)
    add(
        "adaptive",
        bonus,
        {"coef_min": 0.02, "coef_max": 0.01, "initial_coef": None},
        "coef_max must be >= coef_min, got coef_min=0.02, coef_max=0.01",
        _adaptive,
    )
    for value, shown in [(0.1, "0.1"), (-0.01, "-0.01"), (math.inf, "inf"), ("0", "'0'")]:
        add(
            "adaptive",
            bonus,
            {"initial_coef": value},
            f"initial_coef must be a number in [0, 0.05] or null, got {shown}",
        )

    for value, shown in _FLAG:
        add(
            "monitor",
            EntropyDynamicsMonitor,
            {"keep_history": value},
            f"keep_history must be true or false, got {shown}",
        )

    _lineage_cases(add)

    for make in CLASSES:
        for value, shown in _PREFIX:
            message = f"log_prefix must be a non-empty string without a trailing '/', got {shown}"
            add(make.__name__, make, {"log_prefix": value}, message)
    return cases


def _lineage_cases(add: Callable[..., None]) -> None:
    """The issue-38 callbacks: STARE, Entrocraft, S2T, advantage reweighting, unlikeliness reward, REPO-R."""
    share01 = [(1.5, "1.5"), (-0.1, "-0.1"), (math.nan, "nan"), ("0.1", "'0.1'")]
    for value, shown in share01:
        add("stare", STARE, {"top_ratio": value}, f"top_ratio must be a number in [0, 1], got {shown}", _stare)
        for name, fn in (("prob_threshold", _s2t), ("entropy_quantile", _s2t)):
            add("s2t", SpuriousTokenSilencing, {name: value}, f"{name} must be a number in [0, 1], got {shown}", fn)
        add(
            "ar", AdvantageReweighting, {"alpha": value}, f"alpha must be a number in [0, 1], got {shown}", _reweighting
        )
        add(
            "unlikely",
            UnlikelinessReward,
            {"beta": value},
            f"beta must be a number in [0, 1], got {shown}",
            _unlikeliness,
        )
    for name in ("reweight_w", "reweight_m"):
        for value, shown in _POSITIVE:
            add("stare", STARE, {name: value}, f"{name} must be a finite number > 0, got {shown}", _stare)
    for name, low in (("target_entropy", "0"), ("alpha", "0"), ("w_max", "1")):
        for value, shown in [(-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan"), ("1", "'1'")]:
            add("stare", STARE, {name: value}, f"{name} must be a finite number >= {low}, got {shown}")
    for value, shown in [(0, "0"), (1.5, "1.5"), (math.nan, "nan")]:
        add("stare", STARE, {"m_min": value}, f"m_min must be a number in (0, 1], got {shown}")
    add("stare", STARE, {"variant": "O2"}, "variant must be one of ('O1', 'C2'), got 'O2'", _stare)
    for value, shown in _FLAG:
        add("stare", STARE, {"adaptive": value}, f"adaptive must be true or false, got {shown}")
    add("stare", STARE, {"scope": "rank"}, "scope must be one of ('global', 'micro_batch'), got 'rank'")
    for value, shown in [(0, "0"), (1.5, "1.5"), (True, "True")]:
        message = f"micro_batch_rows must be an integer >= 1 or null, got {shown}"
        add("stare", STARE, {"micro_batch_rows": value}, message)

    for name in ("lower_range", "upper_range"):
        for value, shown in [(0.5, "0.5"), ((0.1, 0.2, 0.3), "(0.1, 0.2, 0.3)")]:
            message = f"{name} must be a pair (start, end) of entropies in nats, got {shown}"
            add("entrocraft", Entrocraft, {name: value}, message)
    add(
        "entrocraft", Entrocraft, {"lower_range": (0.6, -0.1)},
        "lower_range[1] must be a finite number >= 0, got -0.1",
    )  # fmt: skip
    add(
        "entrocraft", Entrocraft, {"lower_range": (0.8, 0.4)},
        "lower_range must stay at or below upper_range, got lower_range=(0.8, 0.4) and upper_range=(0.7, 0.5)",
    )  # fmt: skip
    add(
        "entrocraft",
        Entrocraft,
        {"schedule": "exp"},
        "schedule must be one of ('linear', 'cos'), got 'exp'",
        _entrocraft,
    )
    add(
        "entrocraft", Entrocraft, {"signal": "logit"}, "signal must be one of ('reward', 'advantage'), got 'logit'",
        _entrocraft,
    )  # fmt: skip
    for value, shown in [(0, "0"), (2.5, "2.5")]:
        message = f"total_batches must be an integer >= 1 or null, got {shown}"
        add("entrocraft", Entrocraft, {"total_batches": value}, message)

    for value, shown in [(-1.0, "-1.0"), (math.inf, "inf"), (math.nan, "nan")]:
        message = f"negative_weight must be a finite number >= 0, got {shown}"
        add("ar", AdvantageReweighting, {"negative_weight": value}, message, _reweighting)
    for value, shown in [(0, "0"), (2.5, "2.5")]:
        add("unlikely", UnlikelinessReward, {"group_size": value}, f"group_size must be an integer >= 1, got {shown}")

    add("repo_r", REPOR, {"zeta": 2.0}, "zeta must be a number in [0.0001, 1], got 2.0")
    add("repo_r", REPOR, {"zeta_min": -1.0}, "zeta_min must be a finite number >= 0, got -1.0")
    add("repo_r", REPOR, {"zeta_max": 0.0}, "zeta_max must be a finite number >= 0.0001, got 0.0")


CASES = _cases()


@pytest.mark.parametrize("case", [c for _, c in CASES], ids=[i for i, _ in CASES])
def test_bad_argument_is_refused_at_construction(case: Case):
    with pytest.raises(ValueError, match=f"^{re.escape(case.message)}$"):
        case.make(**case.kwargs)


_WITH_MATH = [(i, c) for i, c in CASES if c.math is not None]


@pytest.mark.parametrize("case", [c for _, c in _WITH_MATH], ids=[i for i, _ in _WITH_MATH])
def test_the_functional_math_refuses_it_with_the_same_message(case: Case):
    with pytest.raises(ValueError, match=f"^{re.escape(case.message)}$"):
        case.math(case.kwargs)


def test_every_argument_of_every_callback_has_a_bad_case():
    """A new constructor argument without a case here fails this test."""
    covered = {(c.make, name) for _, c in CASES for name in c.kwargs}
    for make in {c.make for _, c in CASES}:
        for name in list(inspect.signature(make).parameters):
            assert (make, name) in covered, f"{make.__name__}({name}=...) has no bad-value case"


@pytest.mark.parametrize(
    ("make", "kwargs", "math_call"),
    [
        (EntropyDiscriminatorClipping, {"method": "clip_b", "mu": 1}, lambda: _clip_b({"mu": 1})),
        (EntropyDiscriminatorClipping, {"method": "clip_v", "max_frac": 1.0}, lambda: _clip_v({"max_frac": 1.0})),
        (EntropyDiscriminatorClipping, {"method": "clip_v", "max_frac": None}, lambda: _clip_v({"max_frac": None})),
        (
            ClipCov,
            {"clip_cov_ratio": 1, "clip_cov_lb": -1e9, "clip_cov_ub": -1e9 + 1},
            lambda: _clip_cov({"clip_cov_ratio": 1}),
        ),
        (KLCov, {"kl_cov_ratio": 1.0, "ppo_kl_coef": 0}, lambda: _kl_cov({"kl_cov_ratio": 1.0, "ppo_kl_coef": 0})),
        (HighEntropySelection, {"rho": 1}, lambda: _high_entropy({"rho": 1})),
        (AdaptiveEntropyBonus, {"coef_min": 0.01, "coef_max": 0.01, "initial_coef": 0.01}, lambda: _adaptive({})),
        (RandomNegativeMasking, {"seed": 2**32 - 1, "mu": 1e-6}, lambda: _clip_b({"mu": 1e-6})),
    ],
)
def test_boundary_values_pass_both(make, kwargs, math_call):
    make(**kwargs)
    math_call()


def test_clip_b_warns_that_it_ignores_a_valid_max_frac():
    with pytest.warns(UserWarning, match=r"max_frac is ignored"):
        EntropyDiscriminatorClipping("clip_b", max_frac=0.5)


@pytest.mark.parametrize(("value", "shown"), [(None, "None"), (2, "2"), (0.0, "0.0")])
def test_the_cap_itself_needs_a_share(value, shown):
    with pytest.raises(ValueError, match=rf"^max_frac must be a number in \(0, 1\], got {shown}$"):
        cap_count(10, value)

"""The adaptive entropy-bonus rule against hand-computed steps."""

from __future__ import annotations

import pytest

from lit_entropy.functional.entropy import adaptive_entropy_coef


@pytest.mark.parametrize(
    ("coef", "entropy", "expected"),
    [
        (0.010, 0.1, 0.013),  # below the target: one step up
        (0.010, 0.5, 0.007),  # above: one step down
        (0.010, 0.2, 0.007),  # at the target: not below, so down
        (0.019, 0.1, 0.020),  # clamped at coef_max
        (0.002, 0.5, 0.001),  # clamped at coef_min
    ],
)
def test_one_step_toward_the_target_clamped(coef, entropy, expected):
    out = adaptive_entropy_coef(coef, entropy, entropy_target=0.2, coef_delta=0.003, coef_min=0.001, coef_max=0.02)
    assert out == pytest.approx(expected, abs=1e-15)

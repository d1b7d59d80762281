"""The adaptive entropy-bonus rule (Skywork-OR1, TRL #6140): step the bonus weight toward a target entropy.

Per rollout batch, with ``H`` the mean token entropy of the batch (nats), the weight ``beta`` of the
entropy bonus moves by a fixed step: up when ``H`` is below the target, down otherwise, clamped to
``[coef_min, coef_max]``. The bonus raises entropy at every position (THEORY §2: ``dH = eta * beta *
||S||^2 >= 0``), so the rule is a bang-bang controller on the batch entropy.
"""

from __future__ import annotations

from lit_entropy.functional.checks import check_number

__all__ = ["adaptive_entropy_coef", "check_adaptive_entropy_args"]


def check_adaptive_entropy_args(
    entropy_target: float,
    coef_delta: float,
    coef_min: float,
    coef_max: float,
    initial_coef: float | None = None,
) -> None:
    """Refuse an argument of the rule: the target and step finite numbers > 0, ``0 <= coef_min <= coef_max``.

    ``initial_coef`` (None = taken from elsewhere) must lie in ``[coef_min, coef_max]``.
    :func:`adaptive_entropy_coef` and :class:`~lit_entropy.callbacks.AdaptiveEntropyBonus` both call it.
    """
    check_number("entropy_target", entropy_target, low=0, low_open=True)
    check_number("coef_delta", coef_delta, low=0, low_open=True)
    check_number("coef_min", coef_min, low=0)
    check_number("coef_max", coef_max, low=0)
    if not coef_min <= coef_max:
        raise ValueError(f"coef_max must be >= coef_min, got coef_min={coef_min!r}, coef_max={coef_max!r}")
    if initial_coef is not None:
        check_number("initial_coef", initial_coef, low=coef_min, high=coef_max, optional=True)


def adaptive_entropy_coef(
    coef: float,
    entropy: float,
    *,
    entropy_target: float,
    coef_delta: float,
    coef_min: float = 0.0,
    coef_max: float = 0.05,
) -> float:
    """The bonus weight for the next updates: ``coef +- coef_delta`` clamped to ``[coef_min, coef_max]``.

    Args:
        coef: the current weight.
        entropy: mean token entropy of the batch (nats); the weight rises when it is below the target.
        entropy_target: target mean token entropy (nats, > 0).
        coef_delta: step per call (> 0).
        coef_min: lower clamp (>= 0).
        coef_max: upper clamp (>= coef_min).

    Returns:
        The new weight.
    """
    check_adaptive_entropy_args(entropy_target, coef_delta, coef_min, coef_max)
    stepped = coef + coef_delta if entropy < entropy_target else coef - coef_delta
    return min(max(stepped, coef_min), coef_max)

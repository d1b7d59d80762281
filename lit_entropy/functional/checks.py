"""Argument checks shared by the functional layer and the settings that feed it.

Every functional entry point validates its arguments with these helpers, and the module's settings
(:mod:`lit_entropy.settings`) call the *same* per-concept checkers (``check_policy_loss_args``,
``check_kl_type``, ...) with their dotted setting names, so an allowed range or name list exists once.
Errors are ``ValueError``s that name the argument (or setting), the value and what is allowed.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from typing import Any

__all__ = ["check_choice", "check_flag", "check_fraction", "check_number", "check_seed"]

#: Largest seed the callbacks accept: ``torch.Generator.manual_seed`` takes 64-bit values and they add offsets.
MAX_SEED = 2**32 - 1


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _bound(value: float) -> str:
    """A bound as the user would write it: ints in full (4294967295, not 4.29497e+09), floats short."""
    return str(value) if isinstance(value, int) else f"{value:g}"


def check_choice(name: str, value: Any, choices: Collection[str]) -> str:
    """Return ``value`` if it is one of ``choices``, else raise naming ``name``, the value and the choices."""
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {tuple(choices)}, got {value!r}")
    return value


def check_number(
    name: str,
    value: Any,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
    high_open: bool = False,
    optional: bool = False,
    integer: bool = False,
) -> Any:
    """Return ``value`` if it is a finite number (an int when ``integer``) inside the given bounds.

    Args:
        name: the argument or setting name used in the message.
        value: the value to check.
        low: lower bound (None = unbounded).
        high: upper bound (None = unbounded).
        low_open: exclude ``low`` itself.
        high_open: exclude ``high`` itself.
        optional: None is allowed (and returned).
        integer: the value must be an int.

    Raises:
        ValueError: naming ``name``, the value and the allowed range.
    """
    if value is None and optional:
        return None
    lo = "" if low is None else ("(" if low_open else "[") + _bound(low)
    hi = "" if high is None else _bound(high) + (")" if high_open else "]")
    if low is not None and high is not None:
        allowed = f"in {lo}, {hi}"
    elif low is not None:
        allowed = (">" if low_open else ">=") + f" {_bound(low)}"
    elif high is not None:
        allowed = ("<" if high_open else "<=") + f" {_bound(high)}"
    else:
        allowed = ""
    # A one-sided range reads as if inf passed ("> 0, got inf"): say "finite" where a side is open-ended.
    finite = "" if integer or (low is not None and high is not None) else "finite "
    kind = "an integer" if integer else f"a {finite}number"
    expected = f"{kind} {allowed}".rstrip() + (" or null" if optional else "")
    ok = (isinstance(value, int) and not isinstance(value, bool)) if integer else _is_number(value)
    ok = ok and math.isfinite(value)
    ok = ok and (low is None or (value > low if low_open else value >= low))
    ok = ok and (high is None or (value < high if high_open else value <= high))
    if not ok:
        raise ValueError(f"{name} must be {expected}, got {value!r}")
    return value


def check_fraction(name: str, value: Any, *, optional: bool = False) -> Any:
    """Return ``value`` if it is a share in ``(0, 1]`` (or None when ``optional``), else raise naming ``name``."""
    return check_number(name, value, low=0, high=1, low_open=True, optional=optional)


def check_flag(name: str, value: Any) -> bool:
    """Return ``value`` if it is a bool, else raise: ``"false"`` or ``0`` from a config is not silently truthy."""
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be true or false, got {value!r}")
    return value


def check_seed(name: str, value: Any) -> int:
    """Return ``value`` if it is an integer seed in ``[0, MAX_SEED]``, else raise naming ``name``."""
    seed: int = check_number(name, value, low=0, high=MAX_SEED, integer=True)
    return seed

"""``model.rollout_correction``: how the gap between the rollout engine's and the trainer's log-probs is corrected.

The math is :mod:`lit_entropy.functional.rollout_correction`; this is its settings group (names in verl's
``rollout_correction`` spirit). The group sits with the engines because it exists for them: it needs one that
reports the log-probs it sampled with (:attr:`~lit_entropy.rollout.RolloutEngine.reports_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from lit_entropy.functional.rollout_correction import check_rollout_correction_args, default_lower

__all__ = ["RolloutCorrectionConfig"]


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """Importance weights ``pi_trainer / pi_rollout`` on each token's policy-loss term (never on the advantages:
    callbacks, the dynamics monitor and the dashboard see the estimator's advantages). Off by default; the
    mismatch metrics (``train/rollout/*``) are logged whenever the engine reports log-probs."""

    level: Literal["token", "sequence", "geometric"] | None = None
    """``token`` (one weight per token), ``sequence`` (the product over the sequence's tokens), ``geometric``
    (their geometric mean, one per sequence); null = off."""
    mode: Literal["truncate", "mask"] = "truncate"
    """``truncate``: weight ``min(w, upper)`` (truncated IS, TIS); ``mask``: ``w`` inside ``[lower, upper]`` and 0
    outside, so the token or sequence drops out of the loss (IcePop-style; it still counts in the normaliser)."""
    upper: float = 2.0
    """Upper bound of the weight (> 0)."""
    lower: float | None = None
    """Lower bound under ``mask`` (in ``[0, upper)``); null = ``1 / upper``. Under ``truncate`` only the fraction
    below it is logged."""

    def __post_init__(self) -> None:
        prefix = "model.rollout_correction."
        if self.level is None:
            changed = [f.name for f in fields(self) if f.name != "level" and getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(
                    f"{prefix}{changed[0]}={getattr(self, changed[0])!r} is set but the correction is off "
                    f"({prefix}level is null): set {prefix}level to token, sequence or geometric"
                )
            return
        check_rollout_correction_args(
            level=self.level, mode=self.mode, upper=self.upper, lower=self.lower, prefix=prefix
        )

    @property
    def enabled(self) -> bool:
        return self.level is not None

    @property
    def lower_bound(self) -> float:
        """``lower``, or ``1 / upper`` when null (0 for ``upper <= 1``)."""
        return default_lower(self.upper) if self.lower is None else self.lower

"""``model.loss.rollout_correction``: correcting the gap between the rollout engine's and the trainer's log-probs.

The math is :mod:`lit_entropy.functional.rollout_correction`; this is its settings group (names in verl's
``rollout_correction`` spirit), nested in ``model.loss`` because its weights multiply each token's policy-loss term.
The class sits with the engines because it exists for them: it needs one that reports the log-probs it sampled
with (:attr:`~lit_entropy.rollout.RolloutEngine.reports_logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal

from lit_entropy.functional.rollout_correction import check_rollout_correction_args, default_lower
from lit_entropy.rollout.base import RolloutEngine

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
    kept_set_logprobs: bool = False
    """Compare the engine's log-probs with the trainer's renormalised over the set top-k / top-p keep (the engines
    report log-probs of that truncated distribution, the trainer's are of the full softmax: without this, weights
    and ``train/rollout/*`` include ``log`` of the kept mass). Costs one more forward per batch when
    ``model.sampling.top_p < 1`` or ``top_k > 0`` (its LM head runs on the response tokens only, in chunks of
    ``model.policy.logprob_chunk_size``); works with the correction off too (metrics only)."""

    def __post_init__(self) -> None:
        prefix = "model.loss.rollout_correction."
        if self.level is None:
            free = ("level", "kept_set_logprobs")
            changed = [f.name for f in fields(self) if f.name not in free and getattr(self, f.name) != f.default]
            if changed:
                raise ValueError(
                    f"{prefix}{changed[0]}={getattr(self, changed[0])!r} is set but the correction is off "
                    f"({prefix}level is null): set {prefix}level to token, sequence or geometric"
                )
            return
        check_rollout_correction_args(
            level=self.level, mode=self.mode, upper=self.upper, lower=self.lower, prefix=prefix
        )

    def check_engine(self, engine: RolloutEngine) -> None:
        """Refuse a correction the engine cannot feed: it must report the log-probs it sampled with."""
        if self.enabled and not engine.reports_logprobs:
            raise ValueError(
                f"model.loss.rollout_correction.level={self.level!r} needs the log-probs the engine sampled with, but "
                f"model.rollout={type(engine).__name__} reports none (RolloutEngine.reports_logprobs)"
            )

    @property
    def enabled(self) -> bool:
        return self.level is not None

    @property
    def lower_bound(self) -> float:
        """``lower``, or ``1 / upper`` when null (0 for ``upper <= 1``)."""
        return default_lower(self.upper) if self.lower is None else self.lower

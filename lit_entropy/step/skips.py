"""Bookkeeping of skipped (non-finite) updates: warn on each, stop a diverging run."""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["SkippedUpdates"]


class SkippedUpdates:
    """Counts updates skipped for a non-finite loss or gradient norm; raises after ``limit`` in a row.

    Args:
        limit: consecutive skips that stop the run (``model.update.max_consecutive_skips``).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0
        self.consecutive = 0

    def record(self, stepped: bool, what: str = "", norm: float = float("nan"), step: int = 0) -> None:
        """Record one optimizer step (``stepped``) or one skip of it.

        Raises:
            RuntimeError: on the ``limit``-th consecutive skip.
        """
        if stepped:
            self.consecutive = 0
            return
        self.total += 1
        self.consecutive += 1
        warnings.warn(
            f"lit_entropy: skipped an update with a non-finite {what} (grad norm {norm}) at step {step}; "
            f"{self.consecutive} in a row, {self.total} in total",
            stacklevel=2,
        )
        if self.consecutive >= self.limit:
            raise RuntimeError(
                f"{self.consecutive} consecutive updates were skipped because the loss or the gradient norm was not "
                f"finite (model.update.max_consecutive_skips={self.limit}); the run is diverging: lower "
                "model.optim.lr, tighten model.optim.max_grad_norm or check the rewards"
            )

    def state_dict(self) -> dict[str, Any]:
        return {"num_skipped_updates": self.total, "consecutive_skipped_updates": self.consecutive}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.total = int(state.get("num_skipped_updates", 0))
        self.consecutive = int(state.get("consecutive_skipped_updates", 0))

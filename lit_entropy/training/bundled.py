"""The callbacks every :class:`~lit_entropy.module.RFTModule` run brings along (its ``configure_callbacks``).

Resumable, atomic checkpoints (RNG states, Ctrl-C); the HPARAMS tab; the CUSTOM SCALARS overview; console lines when
not a TTY; evaluations logged at the number of trained batches; the policy's health after each update. A callback
of the same type passed to the Trainer wins, without Lightning's "will override existing callbacks" line.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch import Callback

from lit_entropy.checkpointing.callback import ResumableCheckpointing
from lit_entropy.reporting.console import ConsoleMetrics
from lit_entropy.reporting.hparams import HParamsSummary
from lit_entropy.reporting.overview import OverviewLayout
from lit_entropy.reporting.steps import StepAxis
from lit_entropy.training.health import PolicyHealth

__all__ = ["bundled_callbacks", "missing_callbacks"]


def bundled_callbacks() -> list[Callback]:
    """New instances of the bundled callbacks (checkpointing, HPARAMS, overview layout, console, step axis,
    policy health)."""
    return [ResumableCheckpointing(), HParamsSummary(), OverviewLayout(), ConsoleMetrics(), StepAxis(), PolicyHealth()]


def missing_callbacks(trainer: Any, bundled: list[Callback]) -> list[Callback]:
    """The ``bundled`` callbacks whose type ``trainer`` (None: not attached) has no callback of."""
    present = trainer.callbacks if trainer is not None else []
    return [own for own in bundled if not any(isinstance(cb, type(own)) for cb in present)]

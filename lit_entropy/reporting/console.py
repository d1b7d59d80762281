"""One compact console line per log interval when stdout is not a terminal (CI logs, ``nohup``, SLURM files)."""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy.internals.lightning import logger_step
from lit_entropy.reporting.evaluation import evaluation_tags

__all__ = ["ConsoleMetrics"]


class ConsoleMetrics(Callback):
    """When stdout is not a terminal (CI logs, ``nohup``, SLURM files): one compact line per log interval.

    ``step 12 | reward 0.523 | entropy 0.331 | val/avg@8 0.375 | 1.84 s/step``; the progress bar stays
    for terminals. Printed by rank 0 every ``trainer.log_every_n_steps`` training batches.

    Args:
        stream: where to print; None = ``sys.stdout`` (checked for a terminal at each line).
    """

    KEYS = (("reward", "train/reward/mean"), ("entropy", "train/entropy/mean"))

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._last: tuple[float, int] | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = (time.perf_counter(), logger_step(trainer))

    @rank_zero_only
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        stream = self.stream or sys.stdout
        if self.stream is None and stream.isatty():
            return
        # Lightning increases the counter only after this hook: +1 counts this batch.
        done = logger_step(trainer) + 1
        if done % max(trainer.log_every_n_steps, 1) and not trainer.should_stop:
            return
        print(self.line(trainer, done), file=stream, flush=True)

    def line(self, trainer: Trainer, done: int) -> str:
        """The line after ``done`` finished training batches (the step of the last one is ``done - 1``)."""
        metrics = trainer.callback_metrics
        parts = [f"step {done - 1}"]
        parts += [f"{name} {float(metrics[key]):.3f}" for name, key in self.KEYS if key in metrics]
        settings = getattr(trainer.lightning_module, "settings", None)
        if settings is not None:
            tags = evaluation_tags("val", settings.evaluation.num_samples, settings.evaluation.pass_ks())
            parts += [f"{tag} {float(metrics[tag]):.3f}" for tag in tags if tag in metrics]
        now = time.perf_counter()
        start, before = self._last or (now, done)
        if done > before:
            parts.append(f"{(now - start) / (done - before):.2f} s/step")
        self._last = (now, done)
        return " | ".join(parts)

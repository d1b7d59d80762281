"""One compact console line per log interval when stdout is not a terminal (CI logs, ``nohup``, SLURM files)."""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary
from lightning.pytorch.utilities.model_summary.model_summary import get_human_readable_count
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only

from lit_entropy.internals.lightning import batch_step_values
from lit_entropy.reporting.evaluation import evaluation_tags
from lit_entropy.reporting.steps import trained_batches

__all__ = ["ConsoleMetrics"]


class ConsoleMetrics(Callback):
    """When stdout is not a terminal (CI logs, ``nohup``, SLURM files): one compact line per log interval.

    ``step 12 | reward 0.523 | entropy 0.331 | val/avg@8 0.375 | 1.84 s/step``; the progress bar stays
    for terminals. Printed by rank 0 every ``trainer.log_every_n_steps`` training batches, and for every
    step a validation was logged at. Steps are TensorBoard's: the training scalars of batch ``i`` and the
    validation after ``i`` batches (the one before training on ``step 0``) share ``step i``; a validation
    after the last batch gets a line of its own. A validation value appears only on its own step.

    Args:
        stream: where to print; None = ``sys.stdout`` (checked for a terminal at each line).
    """

    KEYS = (("reward", "train/reward/mean"), ("entropy", "train/entropy/mean"))

    def __init__(self, stream: TextIO | None = None) -> None:
        self.stream = stream
        self._last: tuple[float, int] | None = None
        self._evaluations: dict[int, list[str]] = {}  # step -> "val/avg@8 0.375" parts not printed yet

    def _out(self) -> TextIO | None:
        stream = self.stream or sys.stdout
        return None if self.stream is None and stream.isatty() else stream

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not any(isinstance(cb, ModelSummary) for cb in trainer.callbacks):  # type: ignore[attr-defined]  # Lightning sets Trainer.callbacks in a connector, unseen by its typing
            rank_zero_info(parameter_line(pl_module))

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = (time.perf_counter(), trained_batches(trainer))

    @rank_zero_only
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn not in ("fit", "validate"):
            return
        settings = getattr(pl_module, "settings", None)
        if settings is None:
            return
        metrics = trainer.callback_metrics
        tags = evaluation_tags("val", settings.evaluation.num_samples, settings.evaluation.pass_ks())
        parts = [f"{tag} {float(metrics[tag]):.3f}" for tag in tags if tag in metrics]
        if parts:
            self._evaluations[trained_batches(trainer)] = parts

    @rank_zero_only
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        stream = self._out()
        if stream is None:
            return
        step = trained_batches(trainer) - 1  # this batch's; its scalars are logged at this step
        # Lightning sets Trainer.log_every_n_steps in a connector, unseen by its typing.
        every: int = trainer.log_every_n_steps  # type: ignore[attr-defined]
        if (step + 1) % max(every, 1) and not trainer.should_stop and step not in self._evaluations:
            return
        values = batch_step_values(trainer)
        if step in self._evaluations or any(key in values for _, key in self.KEYS):
            print(self.line(trainer, step, values), file=stream, flush=True)

    @rank_zero_only
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        stream = self._out()
        if stream is None:
            return
        for step in sorted(self._evaluations):  # the validation after the last batch
            print(" | ".join([f"step {step}", *self._evaluations.pop(step)]), file=stream, flush=True)

    def line(self, trainer: Trainer, step: int, values: Mapping[str, Any] | None = None) -> str:
        """The line of training batch ``step`` (counted from the run's start) and a validation logged at it;
        ``values``: the batch's logged values (None = ``trainer.callback_metrics``)."""
        metrics = trainer.callback_metrics if values is None else values
        parts = [f"step {step}"]
        parts += [f"{name} {float(metrics[key]):.3f}" for name, key in self.KEYS if key in metrics]
        parts += self._evaluations.pop(step, [])
        for old in [s for s in self._evaluations if s < step]:  # measured on a step whose line was not printed
            del self._evaluations[old]
        now, done = time.perf_counter(), step + 1
        start, before = self._last or (now, done)
        if done > before:
            parts.append(f"{(now - start) / (done - before):.2f} s/step")
        self._last = (now, done)
        return " | ".join(parts)


def parameter_line(module: LightningModule) -> str:
    """``lit_entropy: 298 K parameters, 298 K trainable (policy: Qwen2ForCausalLM)``: what Lightning's model summary
    table said that matters here (lit-entropy turns that table off: its FLOPs column is always 0 without an
    example input, and the rows list the module's helpers)."""
    params = list(module.parameters())
    total = sum(p.numel() for p in params)
    trainable = sum(p.numel() for p in params if p.requires_grad)
    policy = getattr(module, "policy", None)
    what = f" (policy: {type(policy).__name__})" if policy is not None else ""
    return (
        f"lit_entropy: {get_human_readable_count(total)} parameters, "
        f"{get_human_readable_count(trainable)} trainable{what}"
    )

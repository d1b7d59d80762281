"""One x-axis per run: the number of rollout batches trained.

Training scalars of batch ``i`` (counted from the run's start) are logged at step ``i``: they describe
rollouts of the policy after ``i`` updates. An evaluation of the policy after ``S`` batches is logged at
``S``: the validation before training at 0, the one after the first batch at 1, a ``validate --ckpt_path``
of a checkpoint written after ``S`` batches at ``S`` (Lightning alone would log an in-fit validation at
``S - 1``, and ``validate`` at 0). A resumed run continues its curves without repeating a point:
TensorBoard drops what the stopped run logged from the checkpoint's step on.

The Lightning internals read here sit in the small functions :func:`trained_batches` and
:func:`checkpoint_trained_batches`.
"""

from __future__ import annotations

import weakref
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy.internals.lightning import forget_step_values
from lit_entropy.internals.tensorboard import event_file_writer
from lit_entropy.reporting.overview import overview_copies

__all__ = ["LOG_DIR_KEY", "StepAxis", "checkpoint_log_dir", "checkpoint_trained_batches", "trained_batches"]


def trained_batches(trainer: Trainer) -> int:
    """Rollout batches whose update is in the weights (all epochs, resumed runs included)."""
    # Lightning types ``total`` as a tracker without ``processed``; a batch progress holds a processed tracker.
    return int(trainer.fit_loop.epoch_loop.batch_progress.total.processed)  # type: ignore[attr-defined]


def checkpoint_trained_batches(checkpoint: dict[str, Any]) -> int:
    """:func:`trained_batches` of the run when ``checkpoint`` was written (0 for a checkpoint without loop state).

    Lightning counts a batch as processed once its training step returned: a checkpoint written at the
    end of a batch, after a validation or at the end of ``fit`` counts that batch, one written from
    inside a training step (Ctrl-C) does not.
    """
    loop = checkpoint.get("loops", {}).get("fit_loop", {})
    total = loop.get("epoch_loop.batch_progress", {}).get("total", {})
    return int(total.get("processed", 0))


_EVALUATION_KEY = "lit_entropy_evaluation"
LOG_DIR_KEY = "lit_entropy_log_dir"
"""Checkpoint key of the run directory the checkpoint belongs to (a SLURM requeue checkpoint lies outside it)."""


def checkpoint_log_dir(checkpoint: dict[str, Any]) -> str | None:
    """The log directory of the run that wrote ``checkpoint`` (None for a run without a logger, or older files)."""
    value = checkpoint.get(LOG_DIR_KEY)
    return None if value is None else str(value)


class StepAxis(Callback):
    """Evaluations at the number of trained batches; a resumed run's curves continue without duplicates.

    * ``setup``: every logger writes validation / test scalars at :meth:`evaluation_step`, the overview cards
      beside their sources, and no ``epoch`` (:func:`_log_evaluations_at`).
    * ``on_save_checkpoint``: a checkpoint records its run's log directory (:func:`checkpoint_log_dir`), and one
      written after a validation of its own weights keeps that validation's scalars; ``on_load_checkpoint``
      reads them and the checkpoint's trained batches (``validate --ckpt_path`` logs there).
    * ``on_train_start`` of a resumed ``fit`` at step ``S`` > 0: a TensorBoard run directory that holds events
      logged at ``S`` or later (the run went on past its checkpoint) gets a restart mark at ``S``, so
      TensorBoard drops them, and the checkpoint's own validation is written again at ``S``; after an exact
      resume (nothing logged past the checkpoint but its own validation) nothing is dropped or repeated.
    * ``on_train_batch_start``: a training batch writes only the scalars logged during it
      (:func:`~lit_entropy.internals.lightning.forget_step_values`); Lightning alone repeats at every batch the
      last value of each key logged earlier in the epoch, e.g. the last update's ``train/*`` at the
      generation batches of DAPO dynamic sampling that end without an update.
    """

    def __init__(self) -> None:
        self.checkpoint_step: int | None = None
        self.last_evaluation: dict[str, Any] | None = None
        self.resumed_evaluation: dict[str, Any] | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        def step() -> int | None:
            evaluating = (trainer.validating or trainer.testing) and not trainer.sanity_checking
            return self.evaluation_step(trainer) if evaluating else None

        for logger in trainer.loggers:
            _log_evaluations_at(logger, step)

    def evaluation_step(self, trainer: Trainer) -> int:
        """The step of an evaluation now: trained batches in ``fit``, the checkpoint's in ``validate`` / ``test``."""
        if trainer.state.fn != "fit" and trainer.ckpt_path is not None and self.checkpoint_step is not None:
            return self.checkpoint_step
        return trained_batches(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.sanity_checking:
            scalars = {k: float(v) for k, v in trainer.logged_metrics.items() if k.startswith("val/")}
            self.last_evaluation = {"step": self.evaluation_step(trainer), "scalars": scalars}

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if trainer.loggers and trainer.log_dir is not None:
            checkpoint[LOG_DIR_KEY] = str(Path(trainer.log_dir).resolve())
        if self.last_evaluation is not None and self.last_evaluation["step"] == trained_batches(trainer):
            checkpoint[_EVALUATION_KEY] = self.last_evaluation

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self.checkpoint_step = checkpoint_trained_batches(checkpoint)
        self.resumed_evaluation = checkpoint.get(_EVALUATION_KEY)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        forget_step_values(trainer)

    @rank_zero_only
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        step = trained_batches(trainer)
        if trainer.ckpt_path is None or step == 0:
            return
        evaluation = self.resumed_evaluation if (self.resumed_evaluation or {}).get("step") == step else None
        scalars = evaluation["scalars"] if evaluation else {}
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                later = tags_logged_from(Path(logger.log_dir), step)
                # An exact resume (the run stopped at its checkpoint) has nothing to drop: no restart mark, so
                # TensorBoard has no "out of order event.step ... Purging" to warn about.
                if not later:
                    if scalars:
                        logger.log_metrics(scalars, step)
                elif later != {step: set(scalars) | set(overview_copies(scalars))}:
                    purge_from(logger.experiment, step)
                    if scalars:
                        logger.log_metrics(scalars, step)
                # else: what the run logged at the checkpoint's step is the checkpoint's own validation, kept


def tags_logged_from(log_dir: Path, step: int) -> dict[int, set[str]]:
    """``{step: tags}`` of the summaries at ``step`` and after in the event files of ``log_dir`` itself."""
    # deferred: tensorboard's protobuf modules take ~0.5 s to import; only this step needs them
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    out: dict[int, set[str]] = {}
    for path in sorted(log_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            if event.step >= step and event.HasField("summary"):
                out.setdefault(int(event.step), set()).update(value.tag for value in event.summary.value)
    return out


def purge_from(writer: Any, step: int) -> None:
    """Write TensorBoard's restart mark: readers drop the run's earlier events at ``step`` and after.

    ``writer``: a ``torch.utils.tensorboard.SummaryWriter`` (what ``SummaryWriter(purge_step=step)`` writes
    when it opens).
    """
    # deferred: tensorboard's protobuf modules take ~0.5 s to import; only this step needs them
    from tensorboard.compat.proto.event_pb2 import Event, SessionLog

    event_file_writer(writer).add_event(Event(session_log=SessionLog(status=SessionLog.START)), step=step)
    writer.flush()


#: logger -> the function that gives the step of an evaluation now (None outside one); the latest one set wins
#: (a logger reused by a later trainer).
_EVALUATION_STEP: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def _log_evaluations_at(logger: Any, evaluation_step: Any) -> None:
    """Make ``logger.log_metrics`` write what it gets while validating or testing at ``evaluation_step()``,
    add the overview cards (:func:`~lit_entropy.reporting.overview.overview_copies`), and drop ``epoch``.

    Lightning's logger connector adds the current epoch to every dict it logs without a step of its own
    (``LoggerConnector.log_metrics``): a staircase card that sorted first in TensorBoard and says nothing the
    step axis does not. Every logger of the trainer goes through this wrapper, so none writes it.
    """
    wrapped = logger in _EVALUATION_STEP
    _EVALUATION_STEP[logger] = evaluation_step
    if wrapped:
        return
    original = logger.log_metrics

    def log_metrics(metrics: dict[str, float], step: int | None = None) -> None:
        metrics = {key: value for key, value in metrics.items() if key != "epoch"}
        metrics.update(overview_copies(metrics))
        if not metrics:
            return
        override = _EVALUATION_STEP[logger]()
        original(metrics, step if override is None else override)

    logger.log_metrics = log_metrics

"""Run-level reporting callbacks RFTModule adds by default: the HPARAMS tab and a console line per log interval."""

from __future__ import annotations

import inspect
import sys
import time
from collections.abc import Mapping
from typing import Any, TextIO

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy.evaluation import evaluation_tags

__all__ = ["ConsoleMetrics", "HParamsSummary", "callback_init_args", "flatten_hparams", "run_hparams"]


def flatten_hparams(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``; values TensorBoard cannot show (None, lists...) become strings."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_hparams(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


_PLAIN = (bool, int, float, str, type(None))


def _is_setting(value: Any) -> bool:
    """Plain data (a number, string, None or a list of them), not an object such as a parser or a stream."""
    return isinstance(value, _PLAIN) or (isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))


def callback_init_args(callback: Callback) -> dict[str, Any]:
    """The plain-data ``__init__`` arguments of ``callback`` that it keeps as attributes of the same name."""
    names = [p for p in inspect.signature(type(callback).__init__).parameters if not p.startswith("_")]
    values = {name: getattr(callback, name) for name in names if name != "self" and hasattr(callback, name)}
    return {name: value for name, value in values.items() if _is_setting(value)}


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """The run's settings, flat: ``model/...`` (the module's hparams), ``data/...`` and ``callbacks/<Class>/...``."""
    params = {"model": dict(pl_module.hparams)}
    data = getattr(trainer, "datamodule", None)
    if data is not None and getattr(data, "hparams", None):
        params["data"] = {key: value for key, value in data.hparams.items() if not key.startswith("_")}
    callbacks: dict[str, Any] = {}
    for callback in trainer.callbacks:
        args = callback_init_args(callback)
        if args:
            callbacks[type(callback).__name__] = args
    params["callbacks"] = callbacks
    return flatten_hparams(params)


class HParamsSummary(Callback):
    """Write the run's settings (module, data and callbacks) to TensorBoard's HPARAMS tab at fit start.

    The validation headline metrics (``val/avg@K`` and the ``val/pass@k`` ladder) are declared as the
    hp metrics, so runs compare side by side. The summary is written directly rather than through
    ``TensorBoardLogger.log_hyperparams(params, metrics)``, which would also write the metrics' given
    placeholder values as scalar points at step 0, next to the real step-0 validation.
    """

    @rank_zero_only
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        if not loggers:
            return
        from torch.utils.tensorboard.summary import hparams

        settings = getattr(pl_module, "settings", None)
        if settings is None:
            return
        tags = evaluation_tags("val", settings.evaluation.num_samples, settings.evaluation.pass_ks())
        params = run_hparams(trainer, pl_module)
        for logger in loggers:
            writer = logger.experiment._get_file_writer()
            for summary in hparams(params, dict.fromkeys(tags, 0.0)):
                writer.add_summary(summary)


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
        self._last = (time.perf_counter(), trainer.fit_loop.epoch_loop._batches_that_stepped)

    @rank_zero_only
    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        stream = self.stream or sys.stdout
        if self.stream is None and stream.isatty():
            return
        # Lightning increases the counter only after this hook: +1 counts this batch.
        done = trainer.fit_loop.epoch_loop._batches_that_stepped + 1
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

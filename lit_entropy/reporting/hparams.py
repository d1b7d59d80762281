"""The HPARAMS tab: the run's settings (module, data, callbacks) beside its headline validation metrics."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy.internals.tensorboard import event_file_writer
from lit_entropy.reporting.evaluation import evaluation_tags

__all__ = ["HParamsSummary", "callback_init_args", "flatten_hparams", "run_hparams"]


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
            writer = event_file_writer(logger.experiment)
            for summary in hparams(params, dict.fromkeys(tags, 0.0)):
                writer.add_summary(summary)

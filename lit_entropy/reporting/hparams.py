"""The HPARAMS tab: the method's settings (model groups, data, entropy callbacks) beside the headline metrics.

Only what shapes the method is shown: the module's settings groups but sample logging and export
(``model/logging``), the data settings but the loader plumbing, and each token callback's effective
arguments (:meth:`~lit_entropy.callbacks.TokenCallback.hparams`). Checkpointing, console and other
Lightning callbacks are not settings of the method and are left out.

TensorBoard shows the first five hyper-parameters of its table, those marked ``differs`` first, then by
name: the callbacks' arguments and :data:`HEADLINE` are marked, so the table opens on the method. The
row of a run is named ``<logger name> v<version>`` (a name TensorBoard's Trial ID column shows whole).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy.internals.tensorboard import event_file_writer
from lit_entropy.reporting.evaluation import evaluation_tags

__all__ = ["HEADLINE", "HParamsSummary", "flatten_hparams", "method_callbacks", "run_hparams", "run_label"]

HEADLINE = (
    "model/algorithm",
    "model/advantages/estimator",
    "model/loss/policy_loss",
    "model/optim/lr",
    "model/sampling/num_samples",
)
"""Model settings the HPARAMS table shows first, after the callbacks' arguments."""

_NOT_METHOD_MODEL = frozenset({"logging"})
#: Data settings that move data around without changing it (the tokenizer is the policy's, linked).
_NOT_METHOD_DATA = frozenset({"num_workers", "cache_dir", "tokenizer_name_or_path"})


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


def method_callbacks(trainer: Trainer) -> list[Any]:
    """The trainer's token callbacks that change the update (keep masks, penalties, loss coefficients), in order."""
    from lit_entropy import protocol

    acting = [
        *protocol.token_mask_providers(trainer),
        *protocol.token_penalty_providers(trainer),
        *protocol.loss_coefficient_providers(trainer),
    ]
    return [callback for callback in trainer.callbacks if any(callback is other for other in acting)]


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """The method's settings, flat: ``model/<group>/...``, ``data/...`` and ``callbacks/<Class>/<argument>``.

    Two callbacks of one class are told apart as ``<Class>``, ``<Class>_2``, ...
    """
    model = {key: value for key, value in pl_module.hparams.items() if key not in _NOT_METHOD_MODEL}
    params: dict[str, Any] = {"model": model}
    data = getattr(trainer, "datamodule", None)
    if data is not None and getattr(data, "hparams", None):
        params["data"] = {
            key: value for key, value in data.hparams.items() if not key.startswith("_") and key not in _NOT_METHOD_DATA
        }
    callbacks: dict[str, Any] = {}
    for callback in method_callbacks(trainer):
        name, number = type(callback).__name__, 2
        while name in callbacks:
            name, number = f"{type(callback).__name__}_{number}", number + 1
        hparams = getattr(callback, "hparams", None)
        callbacks[name] = hparams() if callable(hparams) else {}
    params["callbacks"] = callbacks
    return flatten_hparams(params)


def run_label(logger: TensorBoardLogger) -> str:
    """``<name> v<N>`` for a logger writing into ``<name>/version_<N>``, else ``<name> <version>``."""
    version = logger.version
    version = f"v{version}" if isinstance(version, int) else str(version).replace("version_", "v")
    return f"{logger.name} {version}" if logger.name else version


class HParamsSummary(Callback):
    """Write the method's settings to TensorBoard's HPARAMS tab at fit start (:func:`run_hparams`).

    The validation headline metrics (``val/avg@K`` and the ``val/pass@k`` ladder) are declared as the
    hp metrics, so runs compare side by side. The summary is written directly rather than through
    ``TensorBoardLogger.log_hyperparams(params, metrics)``, which would also write the metrics' given
    placeholder values as scalar points at step 0, next to the real step-0 validation.
    """

    @rank_zero_only
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        settings = getattr(pl_module, "settings", None)
        if not loggers or settings is None:
            return
        tags = evaluation_tags("val", settings.evaluation.num_samples, settings.evaluation.pass_ks())
        params = run_hparams(trainer, pl_module)
        first = {name for name in params if name.startswith("callbacks/") or name in HEADLINE}
        for logger in loggers:
            writer = event_file_writer(logger.experiment)
            for summary in _summaries(params, tags, first, run_label(logger)):
                writer.add_summary(summary)


def _summaries(params: dict[str, Any], metric_tags: list[str], first: set[str], label: str) -> list[Any]:
    """torch's HPARAMS summaries (experiment, session start, session end) with ``first`` marked ``differs`` and
    the session's group named ``label``."""
    from tensorboard.plugins.hparams import plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams

    summaries = list(hparams(params, dict.fromkeys(metric_tags, 0.0)))
    for summary in summaries[:2]:
        value = summary.value[0]
        data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
        if data.HasField("experiment"):
            for info in data.experiment.hparam_infos:
                info.differs = info.name in first
        else:
            data.session_start_info.group_name = label
        value.metadata.plugin_data.content = data.SerializeToString()
    return summaries

"""The HPARAMS tab: the method's settings (model groups, data, entropy callbacks), one row per run.

Only what shapes the method is shown: the module's settings groups but sample logging and export
(``model/logging``), the data settings but the loader plumbing, and each token callback's effective
arguments (:meth:`~lit_entropy.callbacks.TokenCallback.hparams`) under ``callbacks/<Class>/``, with
``callbacks`` naming them (``none`` without any). Checkpointing, console and other Lightning callbacks
are not settings of the method and are left out.

Each run writes only its session (its settings and its row name, ``<logger name> v<version>``, which
the Trial ID column shows whole), no experiment summary: TensorBoard reads the experiment summary of
one arbitrary run, so a GRPO run's would hide a Clip_B run's callback columns. From the sessions it
builds the union of every run's columns, shows those whose values differ between runs first, and takes
the metrics from the runs' scalars: the first five it shows are the ``overview/`` cards.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

from lit_entropy import protocol
from lit_entropy.internals.tensorboard import event_file_writer

__all__ = ["HParamsSummary", "flatten_hparams", "method_callbacks", "run_hparams", "run_label"]

_NOT_METHOD_MODEL = frozenset({"logging"})
#: Data settings that move data around without changing it (the tokenizer is the policy's, linked).
_NOT_METHOD_DATA = frozenset({"num_workers", "cache_dir", "tokenizer_name_or_path"})


def flatten_hparams(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a/b": 1}``; values TensorBoard cannot show (None, lists...) become strings, and so
    do booleans (torch's summary would show them as 0.0000 / 1.0000)."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_hparams(value, f"{name}/"))
        elif isinstance(value, bool):
            out[name] = str(value)
        elif isinstance(value, (int, float, str)):
            out[name] = value
        else:
            out[name] = str(value)
    return out


def method_callbacks(trainer: Trainer) -> list[Any]:
    """The trainer's token callbacks that change the update (keep masks, penalties, loss coefficients), in order."""
    acting = [
        *protocol.token_mask_providers(trainer),
        *protocol.token_penalty_providers(trainer),
        *protocol.loss_coefficient_providers(trainer),
    ]
    callbacks = trainer.callbacks  # type: ignore[attr-defined]  # Lightning sets Trainer.callbacks in a connector, unseen by its typing
    return [callback for callback in callbacks if any(callback is other for other in acting)]


def run_hparams(trainer: Trainer, pl_module: LightningModule) -> dict[str, Any]:
    """The method's settings, flat: ``model/<group>/...``, ``data/...``, ``callbacks`` (the callbacks' names, comma
    separated, or ``none``) and ``callbacks/<Class>/<argument>``.

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
    flat = flatten_hparams(params)
    flat.update(flatten_hparams({"callbacks": callbacks}))
    flat["callbacks"] = ", ".join(callbacks) or "none"
    return flat


def run_label(logger: TensorBoardLogger) -> str:
    """``<name> v<N>`` for a logger writing into ``<name>/version_<N>``, else ``<name> <version>``."""
    version = logger.version
    version = f"v{version}" if isinstance(version, int) else str(version).replace("version_", "v")
    return f"{logger.name} {version}" if logger.name else version


class HParamsSummary(Callback):
    """Write the run's session to TensorBoard's HPARAMS tab at fit start: :func:`run_hparams`, named :func:`run_label`.

    Written directly rather than through ``TensorBoardLogger.log_hyperparams``, which would add an experiment
    summary (see the module's docstring) and placeholder metric values as scalar points at step 0.
    """

    @rank_zero_only
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loggers = [logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
        if not loggers or getattr(pl_module, "settings", None) is None:
            return
        params = run_hparams(trainer, pl_module)
        for logger in loggers:
            writer = event_file_writer(logger.experiment)
            for summary in session_summaries(params, run_label(logger)):
                writer.add_summary(summary)


def session_summaries(params: dict[str, Any], label: str) -> list[Any]:
    """torch's HPARAMS session summaries (start with ``params``, end) without the experiment summary, the session's
    group named ``label``."""
    # deferred: tensorboard's protobuf modules take ~0.5 s to import; only this step needs them
    from tensorboard.plugins.hparams import plugin_data_pb2
    from torch.utils.tensorboard.summary import hparams

    _, start, end = hparams(params, {})
    value = start.value[0]
    data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
    data.session_start_info.group_name = label
    value.metadata.plugin_data.content = data.SerializeToString()
    return [start, end]

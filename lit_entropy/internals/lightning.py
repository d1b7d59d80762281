"""Private Lightning (2.6) state that lit_entropy reads or changes, each in one function.

Pinned by ``tests/internals/test_lightning.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import _get_rank
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

__all__ = [
    "LOGGER_STEP_KEY",
    "add_subcommand_parsers",
    "attached_trainer",
    "batch_step_values",
    "callback_state_key",
    "cluster_environment",
    "forget_step_values",
    "hpc_checkpoint_path",
    "hpc_resume_path",
    "hpc_resume_path_in",
    "last_saved_step",
    "load_pending_loader_states",
    "logger_experiment_if_open",
    "logger_step",
    "logger_version_if_set",
    "next_logger_version",
    "process_rank",
    "run_cli_subcommand",
    "set_logger_version",
    "mark_saved_step",
    "rewind_logger_step",
    "saved_loader_states",
    "set_data_parallel_size",
]

LOGGER_STEP_KEY = "_batches_that_stepped"
"""The training epoch loop's counter of finished training batches: the step Lightning logs at."""


def attached_trainer(module: Any) -> Any | None:
    """The Trainer ``module`` is attached to, or None (``module.trainer`` raises instead when there is none).

    Anything that is not a LightningModule (a test double, a user's own module) answers with its
    ``trainer`` attribute, if any.
    """
    if isinstance(module, LightningModule):
        return module._trainer
    return getattr(module, "trainer", None)


def callback_state_key(callback: Any, **settings: Any) -> str:
    """A callback's ``state_key`` that tells apart instances with different ``settings`` (Lightning's own format,
    ``"<ClassName>{<settings>}"``, so checkpoints written before keep loading)."""
    return callback._generate_state_key(**settings)


def logger_step(trainer: Any) -> int:
    """The step Lightning writes this training batch's ``self.log`` scalars at.

    Lightning's logger connector logs at ``fit_loop.epoch_loop._batches_that_stepped``, which counts the
    finished training batches and is increased only after the batch's metrics are written (after
    ``on_train_batch_end``); during training batch ``i`` (from the start) it is ``i``, whereas
    ``global_step`` already counts the optimizer steps taken in that batch.
    """
    return int(getattr(trainer.fit_loop.epoch_loop, LOGGER_STEP_KEY))


def forget_step_values(trainer: Any, keep_fx: str = "on_train_batch_start") -> None:
    """Forget the step values ``self.log`` got in earlier training batches: a batch then writes only its own.

    Lightning's result collection keeps the last ``on_step`` value of every key logged in the epoch (each
    ``_ResultMetric._forward_cache``) and hands all of them to the loggers at the end of every training
    batch, so a key a batch did not log repeats its last value there (lightning 2.6): a batch without an
    update (DAPO dynamic sampling) would repeat the last update's scalars. Call it when a training batch
    starts; values logged by hooks named ``keep_fx`` (they may already have run in this batch) are kept, and
    epoch aggregates are untouched.
    """
    for item in trainer.fit_loop.epoch_loop._results.values():
        if item.meta.on_step and item.meta.fx != keep_fx:
            item._forward_cache = None


def batch_step_values(trainer: Any) -> dict[str, Any]:
    """The ``on_step`` values logged so far in the current training batch, by name (after
    :func:`forget_step_values`; otherwise also every earlier batch's last value). ``trainer.callback_metrics``
    instead keeps every value ever logged."""
    return dict(trainer.fit_loop.epoch_loop._results.metrics(True)["callback"])


def rewind_logger_step(checkpoint: dict[str, Any]) -> None:
    """Take one off the logging step saved in ``checkpoint`` (a batch in progress that had not stepped).

    Lightning adds one to the logging step when it resumes a batch that had not ended.
    """
    epoch_loop = checkpoint.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    if LOGGER_STEP_KEY in epoch_loop:
        epoch_loop[LOGGER_STEP_KEY] = max(0, int(epoch_loop[LOGGER_STEP_KEY]) - 1)


def saved_loader_states(checkpoint: dict[str, Any]) -> list[Any]:
    """The training loaders' ``state_dict`` entries saved in ``checkpoint`` (the list itself: edit in place)."""
    return checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader", [])


def load_pending_loader_states(trainer: Any) -> bool:
    """Hand the saved data position to the training loader if Lightning has not; True when it did.

    Lightning restores loader states in ``FitLoop.setup_data`` only while restarting, but a
    ``configure_optimizers`` that reads ``trainer.estimated_stepping_batches`` sets the data up *before*
    the loops are restored, and the states are then never applied (lightning 2.6).
    """
    fit_loop = trainer.fit_loop
    states = fit_loop._combined_loader_states_to_load
    loader = fit_loop._combined_loader
    if not states or loader is None:
        return False
    loader._load_state_dicts(states)
    fit_loop._combined_loader_states_to_load = []
    return True


def hpc_checkpoint_path(trainer: Any) -> Path:
    """Where Lightning's SLURM requeue checkpoint goes: the next ``hpc_ckpt_<N>.ckpt`` of ``default_root_dir``."""
    return Path(trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir))


def hpc_resume_path(trainer: Any) -> str | None:
    """The ``hpc_ckpt_<N>.ckpt`` a requeued SLURM job resumes from without ``--ckpt_path``, or None."""
    return trainer._checkpoint_connector._hpc_resume_path


def hpc_resume_path_in(directory: str | Path) -> Path | None:
    """The ``hpc_ckpt_<N>.ckpt`` of ``directory`` that a requeued SLURM job resumes from (the highest ``N``), or None.

    :func:`hpc_resume_path` without a Trainer: the command line places the logger before the Trainer exists.
    """
    if not Path(directory).is_dir():
        return None
    # A name-mangled private of Lightning's, which its typing does not expose.
    find = _CheckpointConnector._CheckpointConnector__max_ckpt_version_in_folder  # type: ignore[attr-defined]
    newest = find(str(directory), "hpc_ckpt_")
    return None if newest is None else Path(directory) / f"hpc_ckpt_{newest}.ckpt"


def cluster_environment(trainer: Any) -> Any | None:
    """The trainer's cluster environment (e.g. ``SLURMEnvironment``), also for single-device strategies."""
    return trainer._accelerator_connector.cluster_environment


def last_saved_step(callback: Any) -> int:
    """The ``global_step`` a ``ModelCheckpoint`` last saved at (0 before its first save)."""
    return callback._last_global_step_saved


def mark_saved_step(callback: Any, step: int) -> None:
    """Tell a ``ModelCheckpoint`` that a checkpoint was written at ``step`` (it skips a second save there)."""
    callback._last_global_step_saved = step


def set_data_parallel_size(strategy: Any, size: int) -> None:
    """Set a ``ModelParallelStrategy``'s data-parallel size before its ``setup_environment`` builds the mesh.

    Its ``data_parallel_size="auto"`` means one replica per node (tensor parallel inside a node); FSDP2
    over every process needs ``num_nodes * num_processes``, known only once the strategy is set up.
    """
    strategy._data_parallel_size = size


def add_subcommand_parsers(cli: Any, parser: Any, commands: dict[str, str], **kwargs: Any) -> None:
    """``LightningCLI._add_subcommands`` for the subcommands in ``commands`` only, each with its own help line.

    Called from an override of ``_add_subcommands``; ``kwargs`` are the per-subcommand parser arguments.
    Building a subcommand's parser walks the signatures of the Trainer, the module and the datamodule,
    so a command builds only its own.
    """
    cli._subcommand_parsers = {}
    subcommands = parser.add_subcommands()
    for name, text in commands.items():
        options = {"description": f"lit-entropy {name}: {text}", **kwargs.get(name, {})}
        cli._subcommand_parsers[name] = cli._prepare_subcommand_parser(cli.trainer_class, name, **options)
        subcommands.add_subcommand(name, cli._subcommand_parsers[name], help=text)


# --------------------------------------------------------------------------- loggers' versions, the CLI's run


def logger_version_if_set(logger: Any) -> Any | None:
    """A TensorBoard / CSV logger's version as given or already chosen, None while Lightning has not picked one
    (reading ``logger.version`` would pick it)."""
    return logger._version


def set_logger_version(logger: Any, version: int | str) -> None:
    """Fix the version a TensorBoard / CSV logger logs under (its ``log_dir`` is ``root_dir/version_<N>``)."""
    logger._version = version


def next_logger_version(logger: Any) -> int:
    """The number Lightning would pick: one above the highest ``version_<N>`` directory of ``logger.root_dir``."""
    return int(logger._get_next_version())


def logger_experiment_if_open(logger: Any) -> Any | None:
    """The logger's writer (TensorBoard's ``SummaryWriter``) when it was created, else None (not created by this)."""
    return getattr(logger, "_experiment", None)


def process_rank() -> int:
    """This process's global rank from the launcher's environment (``RANK``, ``LOCAL_RANK``, ``SLURM_PROCID``,
    ...), before any process group exists; 0 when none is set."""
    return _get_rank() or 0


def run_cli_subcommand(cli: Any, subcommand: str) -> None:
    """LightningCLI's own run of ``subcommand`` (``before_<sub>``, the trainer method, ``after_<sub>``)."""
    LightningCLI._run_subcommand(cli, subcommand)

"""What ``lit-entropy`` checks against the data before any model is loaded.

- :func:`preflight_data`: every source the command reads is loaded, rendered and tokenized, and each problem
  (a missing column, a batch larger than the data, characters the tokenizer cannot encode, own data with the
  embedded model, ...) becomes one line naming the ``data.*`` setting, as settings errors do.
- :func:`apply_default_budget`: ``trainer.max_steps``, when set, alone decides the length of a run.
- :func:`check_cadences`: a cadence counted within an epoch (``trainer.val_check_interval``) fits in the
  number of training batches one epoch has, named with both settings and the count (Lightning would refuse it
  only after the model has loaded and the first validation has run).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from lit_entropy.cli.errors import SettingsError

__all__ = [
    "DEFAULT_MAX_EPOCHS",
    "apply_default_budget",
    "check_cadences",
    "data_error_line",
    "preflight_data",
    "training_batches",
]

#: Epochs run when the command line and the configs set no budget (Lightning's own default is 1000).
DEFAULT_MAX_EPOCHS = 3


def preflight_data(datamodule: Any, stage: str, world_size: int) -> None:
    """Build the data ``stage`` (``"fit"``, ``"validate"``, ``"test"``) reads, with ``world_size`` data-parallel
    ranks; a data problem is raised as a :class:`SettingsError` of one line."""
    preflight = getattr(datamodule, "preflight", None)
    if not callable(preflight):  # a data module of the user's own: Lightning's hooks build it later
        return
    try:
        preflight(stage, world_size)
    except ValueError as err:
        raise SettingsError(data_error_line(str(err), datamodule)) from err


def data_error_line(message: str, datamodule: Any) -> str:
    """``message`` as one line, its leading setting written as the dotted ``data.<name>`` a user types."""
    line = " ".join(message.split())
    names = set(inspect.signature(type(datamodule).__init__).parameters) - {"self"}
    first = re.match(r"[A-Za-z_]\w*", line)
    if first is not None and first[0] in names:
        return f"data.{line}"
    return f"data: {line}"


def training_batches(trainer: Any, datamodule: Any, world_size: int) -> int | None:
    """Training batches per epoch and rank, after ``trainer.limit_train_batches`` (None: unknown)."""
    count = getattr(datamodule, "train_batches_per_epoch", None)
    if not callable(count):
        return None
    batches = int(count(world_size))
    limit = trainer.limit_train_batches
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return int(batches * float(limit)) if limit is not None else batches


def check_cadences(trainer: Any, datamodule: Any, world_size: int) -> None:
    """Refuse ``trainer.val_check_interval`` (an integer: batches within an epoch) larger than an epoch.

    Lightning counts an integer interval within each epoch unless ``trainer.check_val_every_n_epoch`` is null
    (then across epochs), and refuses one larger than the epoch when its training loop starts. Step-counted
    cadences (``trainer.log_every_n_steps``, ``model.logging.log_samples_every_n_steps``, a ModelCheckpoint's
    ``every_n_train_steps``) count across epochs and need no check (Lightning's warning about a logging interval
    longer than an epoch is silenced: it does not apply).
    """
    batches = training_batches(trainer, datamodule, world_size)
    if batches is not None and trainer.log_every_n_steps > batches:
        # Lightning warns that such an epoch logs nothing, but logging counts batches over the run (as do the
        # console lines): the warning would mislead a run of many short epochs.
        import warnings

        warnings.filterwarnings("ignore", message=r"The number of training batches \(\d+\) is smaller than the logging")
    interval = trainer.val_check_interval
    if not isinstance(interval, int) or isinstance(interval, bool):
        return  # a fraction of the epoch, or a time
    if trainer.check_val_every_n_epoch is None or not trainer.limit_val_batches:
        return
    if batches is None or batches == 0 or interval <= batches:
        return
    raise SettingsError(
        f"trainer.val_check_interval={interval} is more than the {batches} training batches of an epoch "
        f"({_epoch_size(trainer, datamodule, world_size)}); set it to at most {batches}, or set "
        "trainer.check_val_every_n_epoch=null to count it in batches across epochs"
    )


def _epoch_size(trainer: Any, datamodule: Any, world_size: int) -> str:
    """How an epoch's batch count comes about, in the settings that make it."""
    data = getattr(datamodule, "train_data", None)
    rows = f"{len(data)} prompts of " if data is not None else ""
    parts = [f"{rows}data.train_dataset={datamodule.train_dataset!r} at data.batch_size={datamodule.batch_size}"]
    if world_size > 1:
        parts.append(f"over {world_size} ranks")
    if isinstance(trainer.limit_train_batches, int) or trainer.limit_train_batches != 1.0:
        parts.append(f"trainer.limit_train_batches={trainer.limit_train_batches}")
    return ", ".join(parts)


def apply_default_budget(trainer_config: Any) -> None:
    """``trainer.max_steps``, when set, alone decides the length of a run: the epochs are unlimited (the data
    repeats as needed). A run without any budget (no max_epochs, max_steps or max_time) gets
    ``DEFAULT_MAX_EPOCHS`` epochs."""
    max_steps = trainer_config.get("max_steps")
    if max_steps is not None and max_steps != -1:
        trainer_config["max_epochs"] = -1
    elif trainer_config.get("max_epochs") is None and trainer_config.get("max_time") is None:
        trainer_config["max_epochs"] = DEFAULT_MAX_EPOCHS

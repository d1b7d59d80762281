"""Every directory a run will write to, checked before the first step (not when the first write fails).

A ``fit`` writes its logger's run directory (events, ``config.yaml``), checkpoints and, at its end, the
exported policy; ``validate`` / ``test`` write the logger's directory. Each is checked up front: it must
be a directory, or creatable (its nearest existing ancestor is a writable directory), and writable.
An error names the setting that chose the path, what is wrong and the path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

from lit_entropy.cli.errors import SettingsError
from lit_entropy.models.export import (
    check_export_target,
    default_export_dir,  # the path the run's export will use
)

__all__ = ["OutputPath", "check_output_paths", "output_path_problem", "run_output_paths"]


@dataclass(frozen=True)
class OutputPath:
    """A directory a run writes to and the setting that chose it."""

    setting: str
    path: str


def output_path_problem(path: str | os.PathLike) -> str | None:
    """Why ``path`` cannot be written as a directory (a file is in the way, no permission), or None."""
    target = Path(path).expanduser().absolute()
    if target.exists():
        if not target.is_dir():
            return f"{target} is a file, not a directory"
        if not os.access(target, os.W_OK | os.X_OK):
            return f"{target} is not writable"
        return None
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                return f"{parent} is a file, so {target} cannot be created"
            if not os.access(parent, os.W_OK | os.X_OK):
                return f"{parent} is not writable, so {target} cannot be created"
            return None
    return None


def run_output_paths(trainer: Any, module: Any, *, fit: bool) -> list[OutputPath]:
    """The directories this run writes to: the loggers', and for ``fit`` the checkpoints' and the export's."""
    out = []
    log_setting = "trainer.logger.init_args.save_dir" if trainer.loggers else "trainer.default_root_dir"
    for logger in trainer.loggers:
        directory = getattr(logger, "log_dir", None) or getattr(logger, "save_dir", None)
        if directory is not None:
            out.append(OutputPath(log_setting, str(directory)))
    if not fit:
        return out
    run_dir = str(trainer.log_dir if trainer.loggers and trainer.log_dir else trainer.default_root_dir)
    for callback in trainer.callbacks:
        if isinstance(callback, ModelCheckpoint):
            if callback.dirpath is not None:
                setting = f"trainer.callbacks ({type(callback).__name__}).init_args.dirpath"
                out.append(OutputPath(setting, str(callback.dirpath)))
            else:
                out.append(OutputPath(log_setting, os.path.join(run_dir, "checkpoints")))
    logging = getattr(getattr(module, "settings", None), "logging", None)
    if logging is not None and logging.export_on_train_end:
        if logging.export_dir is not None:
            out.append(OutputPath("model.logging.export_dir", str(logging.export_dir)))
        elif trainer.loggers:  # without a logger (and no export_dir) nothing is exported
            out.append(OutputPath("model.logging.export_dir (null: <log_dir>/hf_model)", default_export_dir(trainer)))
    return out


def check_output_paths(trainer: Any, module: Any, *, fit: bool) -> None:
    """Raise a :class:`SettingsError` for the first output directory that cannot be written.

    ``model.logging.export_dir`` is also checked as an export target (no other data in it), as ``fit``
    would check it only when it ends.
    """
    for output in run_output_paths(trainer, module, fit=fit):
        if "://" in output.path:  # a remote file system (s3://, ...): its own client reports errors
            continue
        problem = output_path_problem(output.path)
        if problem is not None:
            raise SettingsError(f"{output.setting}: cannot write there ({problem}), got {output.path!r}")
        if output.setting == "model.logging.export_dir":
            check_export_target(output.path, setting=output.setting)

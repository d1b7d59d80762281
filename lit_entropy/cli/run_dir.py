"""Where a ``--ckpt_path`` command logs: the run the checkpoint belongs to.

``fit --ckpt_path <save_dir>/<name>/<version>/checkpoints/X.ckpt`` continues logging into ``<version>``, and
so does a requeued SLURM job that Lightning resumes from ``<default_root_dir>/hpc_ckpt_<N>.ckpt`` (the
checkpoint records its run's directory);
``validate`` / ``test`` of such a checkpoint log into ``<version>/<subcommand>_step_<S>``, a TensorBoard
run of its own inside the training run, at the checkpoint's step ``S`` (trained batches). Only a
TensorBoardLogger given by ``class_path`` whose ``version`` is unset (or the checkpoint's) is placed.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lit_entropy.internals.lightning import (
    logger_experiment_if_open,
    logger_version_if_set,
    next_logger_version,
    process_rank,
    set_logger_version,
)
from lit_entropy.reporting.steps import trained_batches

__all__ = [
    "checkpoint_run_dir",
    "claim_version_dirs",
    "loggers_kept_open",
    "place_logger",
    "release_unused_run_dirs",
]

#: Environment variable through which the other ranks of a run learn the versions rank 0 claimed
#: (Lightning starts them with rank 0's environment): ``{logger root directory: version number}``.
CLAIMED_VERSIONS_ENV = "LIT_ENTROPY_CLAIMED_VERSIONS"


def checkpoint_run_dir(ckpt_path: str | Path) -> Path | None:
    """``<run>`` for ``<run>/checkpoints/<file>`` when ``<run>`` holds a run (a config.yaml or event files)."""
    path = Path(ckpt_path)
    if path.parent.name != "checkpoints":
        return None
    run = path.parent.parent
    if (run / "config.yaml").is_file() or any(run.glob("events.out.tfevents.*")):
        return run
    return None


def place_logger(
    trainer_config: Any, subcommand: str, ckpt_path: str | Path, step: int, log_dir: str | Path | None = None
) -> Path | None:
    """Point the configured TensorBoardLogger at the checkpoint's run (in place); returns that run when
    ``fit`` continues it, else None.

    Args:
        trainer_config: the parsed ``trainer`` settings (its ``logger`` entry is edited).
        subcommand: ``fit``, ``validate`` or ``test``.
        ckpt_path: the ``--ckpt_path`` given.
        step: the checkpoint's trained batches.
        log_dir: the run directory the checkpoint records (a SLURM requeue checkpoint lies in
            ``trainer.default_root_dir``, outside its run); used when ``ckpt_path`` is not inside a run.
    """
    logger = trainer_config.get("logger")
    if not hasattr(logger, "get") or not str(logger.get("class_path", "")).endswith("TensorBoardLogger"):
        return None
    init = logger.get("init_args")
    if init is None:
        return None
    root = Path(str(init.get("save_dir") or ".")) / str(init.get("name") or "")
    run = checkpoint_run_dir(ckpt_path)
    if run is None and log_dir is not None and Path(log_dir).is_dir():
        run = Path(log_dir)
    version = init.get("version")
    ours = run is not None and version in (None, run.name) and _same(run.parent, root)
    if ours and run is not None:
        init["version"] = run.name
    if subcommand in ("validate", "test") and init.get("sub_dir") is None:
        version_dir = root / str(init["version"]) if init.get("version") is not None else None
        init["sub_dir"] = _free_name(version_dir, f"{subcommand}_step_{step}")
    return run if ours and subcommand == "fit" else None


def _same(a: Path, b: Path) -> bool:
    return a.resolve() == b.resolve()


def _free_name(parent: Path | None, base: str) -> str:
    """``base``, or ``base_2``, ``base_3``, ... when ``parent`` already holds it (a checkpoint validated again)."""
    if parent is None or not (parent / base).exists():
        return base
    number = 2
    while (parent / f"{base}_{number}").exists():
        number += 1
    return f"{base}_{number}"


def claim_version_dirs(trainer: Any) -> list[Path]:
    """Take each logger's next free ``version_<N>`` directory with an atomic ``os.mkdir``; returns those created.

    Lightning picks the next version by listing the directory, so two runs started at once both took
    ``version_0`` (the second was then refused as "a previous run"). ``mkdir`` succeeds for one process
    only; the other takes the next number. Loggers with a version set (a resumed run, ``--trainer.logger
    .init_args.version``) and remote directories are left alone. Ranks other than 0 take rank 0's versions.
    """
    rank = process_rank()
    inherited = json.loads(os.environ.get(CLAIMED_VERSIONS_ENV) or "{}") if rank != 0 else {}
    claimed: list[Path] = []
    for logger in trainer.loggers:
        if not isinstance(logger, (TensorBoardLogger, CSVLogger)) or logger_version_if_set(logger) is not None:
            continue
        root = logger.root_dir
        if "://" in str(root):
            continue
        key = str(Path(root).absolute())
        if rank != 0:
            if key in inherited:
                set_logger_version(logger, inherited[key])
            continue
        try:
            Path(root).mkdir(parents=True, exist_ok=True)
        except OSError:  # a file in the way, no permission: check_output_paths names the setting and the path
            continue
        version = next_logger_version(logger)
        while True:
            try:
                os.mkdir(Path(root) / f"version_{version}")
                break
            except FileExistsError:  # another run took it between the listing and now
                version += 1
        set_logger_version(logger, version)
        claimed.append(Path(root) / f"version_{version}")
        inherited[key] = version
    if claimed:
        os.environ[CLAIMED_VERSIONS_ENV] = json.dumps(inherited)
    return claimed


def release_unused_run_dirs(claimed: list[Path], trainer: Any) -> list[Path]:
    """Delete the version directories this process claimed when its run failed before its first training step.

    A run that trained no batch and wrote no checkpoint leaves nothing worth keeping (a config.yaml, an
    events file of the step-0 validation); removing its directory keeps the next run's number where it
    was. Returns the directories removed.
    """
    fn = getattr(trainer.state, "fn", None) if trainer is not None else None
    if trainer is not None and fn == "fit" and trained_batches(trainer) > 0:
        return []
    removed = []
    for directory in claimed:
        if directory.is_dir() and not any(directory.rglob("*.ckpt")):
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


@contextmanager
def loggers_kept_open(trainer: Any) -> Iterator[None]:
    """Inside the block, the end of a ``trainer.validate`` flushes the loggers instead of closing them.

    Lightning finalizes the loggers at the end of every ``trainer.fn``: TensorBoard's writer closes, and the
    ``fit`` that follows the step-0 validation would open a second event file, so a reader of one file
    would see the validation curve start at the first in-fit validation. One event stream per run.
    """
    originals = {}
    for logger in trainer.loggers:
        originals[logger] = logger.finalize

        def flush(status: str, logger: Any = logger) -> None:
            experiment = logger_experiment_if_open(logger)
            if experiment is not None and hasattr(experiment, "flush"):
                experiment.flush()
            logger.save()

        logger.finalize = flush
    try:
        yield
    finally:
        for logger, finalize in originals.items():
            logger.finalize = finalize

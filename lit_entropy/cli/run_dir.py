"""Where a ``--ckpt_path`` command logs: the run the checkpoint belongs to.

``fit --ckpt_path <save_dir>/<name>/<version>/checkpoints/X.ckpt`` continues logging into ``<version>``, and
so does a requeued SLURM job that Lightning resumes from ``<default_root_dir>/hpc_ckpt_<N>.ckpt`` (the
checkpoint records its run's directory);
``validate`` / ``test`` of such a checkpoint log into ``<version>/<subcommand>_step_<S>``, a TensorBoard
run of its own inside the training run, at the checkpoint's step ``S`` (trained batches). Only a
TensorBoardLogger given by ``class_path`` whose ``version`` is unset (or the checkpoint's) is placed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["checkpoint_run_dir", "place_logger"]


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
    if ours:
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

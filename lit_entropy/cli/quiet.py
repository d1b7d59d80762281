"""Quiet output of the command line: the known noise (:mod:`lit_entropy.internals.noise`), progress bars off a terminal,
and info lines dropped inside a block."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lit_entropy.internals.noise import LIGHTNING_LOGGERS, LOG_NOISE, WARNING_NOISE, DropPrefixes, silence_known_noise

__all__ = [
    "LOG_NOISE",
    "WARNING_NOISE",
    "off_terminal",
    "quiet_checkpoint_restore",
    "quiet_log_lines",
    "silence_known_noise",
    "silence_progress_bars",
]


def off_terminal(stream: Any = None) -> bool:
    """Whether ``stream`` (default ``sys.stdout``) goes to a file or a pipe (CI logs, ``nohup``, SLURM files)."""
    stream = sys.stdout if stream is None else stream
    return not stream.isatty()


def silence_progress_bars() -> None:
    """Off a terminal: no transformers / Hugging Face Hub progress bars ("Loading weights", "Writing model
    shards"); in a file each redraw is a line of ``\r``-separated bars. Must run before transformers is
    imported (it reads the setting once); a value the user set is kept. Lightning's own bar is turned off by
    the command line (``trainer.enable_progress_bar``), where :class:`~lit_entropy.reporting.ConsoleMetrics`
    prints step lines instead.
    """
    if off_terminal(sys.stderr):  # where tqdm draws
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_checkpoint_restore() -> None:
    """``validate`` / ``test`` never save checkpoints: Lightning's warning, on restoring a ModelCheckpoint's state
    from ``--ckpt_path``, that "the dirpath has changed ... won't be reloaded" (its best-k bookkeeping) does
    not apply to them (a run's own validation logs inside the run, see :mod:`lit_entropy.cli.run_dir`, but
    ``--trainer.logger=false`` or a checkpoint outside its run still moves the directory)."""
    warnings.filterwarnings("ignore", message=r"The dirpath has changed from .* won't be reloaded")


@contextmanager
def quiet_log_lines(*prefixes: str) -> Iterator[None]:
    """Drop Lightning / lit_entropy info lines starting with ``prefixes`` inside the block."""
    drop = DropPrefixes(prefixes)
    loggers = [logging.getLogger(name) for name in LIGHTNING_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)

"""Messages of Lightning and torch that tell a lit-entropy user nothing they can act on, silenced by the CLI.

Each entry says why it is noise for our users. What a user must act on (settings refused, a checkpoint
directory reused by a new run, an untrusted remote checkpoint, ...) is left alone.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["LOG_NOISE", "WARNING_NOISE", "quiet_log_lines", "silence_known_noise"]

#: Lightning info lines (prefixes) that say nothing to a lit-entropy user.
LOG_NOISE = (
    # Advertisements for Lightning's cloud products, printed by every Trainer.
    "💡 Tip:",
    # RFTModule.configure_optimizers reads the number of steps for the LR schedule; nothing to act on.
    "Loading `train_dataloader` to estimate number of stepping batches.",
)

#: Warning messages (regular expressions matched at the start) that say nothing to a lit-entropy user.
WARNING_NOISE = (
    # Lightning 2.6 calls a torch pytree API that torch 2.13 deprecates; fixed by upgrading Lightning, not by us.
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",
)

_LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropPrefixes(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def silence_known_noise() -> None:
    """Drop :data:`LOG_NOISE` lines and :data:`WARNING_NOISE` warnings for the rest of the process (idempotent)."""
    for name in _LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropPrefixes) and f.prefixes == LOG_NOISE for f in logger.filters):
            logger.addFilter(_DropPrefixes(LOG_NOISE))
    for message in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message)


@contextmanager
def quiet_log_lines(*prefixes: str) -> Iterator[None]:
    """Drop Lightning / lit_entropy info lines starting with ``prefixes`` inside the block."""
    drop = _DropPrefixes(prefixes)
    loggers = [logging.getLogger(name) for name in _LIGHTNING_LOGGERS]
    for logger in loggers:
        logger.addFilter(drop)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeFilter(drop)

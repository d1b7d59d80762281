"""Messages of Lightning and torch that tell a lit_entropy user nothing they can act on, silenced on import.

Each entry says why it is noise. What a user must act on (settings refused, a checkpoint directory reused by a
new run, an untrusted remote checkpoint, ...) is left alone. Imported by ``lit_entropy/__init__.py``, so a
script that uses lit_entropy's callbacks and metrics with its own Trainer is as quiet as ``lit-entropy fit``;
standard library only (``import lit_entropy.protocol`` stays light).
"""

from __future__ import annotations

import logging
import warnings

__all__ = ["LIGHTNING_LOGGERS", "LOG_NOISE", "WARNING_NOISE", "DropPrefixes", "silence_known_noise"]

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

LIGHTNING_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class DropPrefixes(logging.Filter):
    """A logging filter that drops the records whose message starts with one of ``prefixes``."""

    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def silence_known_noise() -> None:
    """Drop :data:`LOG_NOISE` lines and :data:`WARNING_NOISE` warnings for the rest of the process (idempotent)."""
    for name in LIGHTNING_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, DropPrefixes) and f.prefixes == LOG_NOISE for f in logger.filters):
            logger.addFilter(DropPrefixes(LOG_NOISE))
    for message in WARNING_NOISE:
        warnings.filterwarnings("ignore", message=message)

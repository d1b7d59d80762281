"""Exit statuses of an interrupted command: a run stopped by a signal never reads as finished."""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from lightning.pytorch.utilities.exceptions import SIGTERMException

from lit_entropy.checkpointing import RunInterrupted, take_interruption

__all__ = ["INTERRUPTED_EXIT", "interruption_exit_status"]


#: Exit status of a run stopped by a signal: 128 + the signal's number, as shells report a process it ended.
INTERRUPTED_EXIT = {"SIGTERM": 143, "SIGINT": 130}


@contextmanager
def interruption_exit_status() -> Iterator[None]:
    """Exit 143 (SIGTERM) or 130 (Ctrl-C) when the command is interrupted, whatever Lightning exits with.

    ``fit`` itself ends a signalled run with :class:`~lit_entropy.checkpointing.RunInterrupted` (its
    checkpoint and resume command already printed); Lightning ends a Ctrl-C with ``sys.exit(1)`` and a
    SIGTERM during a validation with a ``SystemExit`` of status 0: those become 130 and 143. A Ctrl-C
    before training (loading the model) prints one line instead of a traceback.
    """
    take_interruption()  # a previous in-process command's
    try:
        yield
    except RunInterrupted:
        raise
    except SIGTERMException:
        interruption = RunInterrupted(signal.SIGTERM, None)
    except KeyboardInterrupt:
        interruption = RunInterrupted(signal.SIGINT, None)
    except SystemExit:
        recorded = take_interruption()
        if recorded is None:
            raise
        interruption = recorded
    else:
        return
    if interruption.path is None:  # else the checkpoint and the resume command are printed already
        print(f"lit-entropy: {interruption} before the first training step; nothing to resume", file=sys.stderr)
    raise SystemExit(interruption.code)

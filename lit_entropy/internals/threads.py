"""The Python stack of another thread, for the error of a hung worker.

CPython offers it only as the underscored (but documented) ``sys._current_frames``; standard library only.
"""

from __future__ import annotations

import sys
import traceback

__all__ = ["thread_stack"]


def thread_stack(ident: int | None) -> str:
    """The formatted current stack of the thread ``ident`` (``threading.Thread.ident``), or a note when it ended."""
    frame = sys._current_frames().get(ident if ident is not None else -1)
    return "".join(traceback.format_stack(frame)) if frame is not None else "(the thread has ended)"

"""Pins :mod:`lit_entropy.internals.threads` (``sys._current_frames``) against the running Python."""

from __future__ import annotations

import threading

from lit_entropy.internals.threads import thread_stack


def _wait_here(started: threading.Event, release: threading.Event) -> None:
    started.set()
    release.wait(30)


def test_the_stack_of_a_waiting_thread_names_the_function_it_waits_in():
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=_wait_here, args=(started, release), daemon=True)
    thread.start()
    try:
        assert started.wait(30)
        stack = thread_stack(thread.ident)
        assert "_wait_here" in stack and "release.wait(30)" in stack
    finally:
        release.set()
        thread.join(30)
    assert thread_stack(thread.ident) == "(the thread has ended)"
    assert thread_stack(None) == "(the thread has ended)"

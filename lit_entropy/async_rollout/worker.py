"""The rollout worker: a thread that loads pushed weights and generates batches, in the order they were sent.

Lightning-free. The trainer sends commands (``load`` weights of a version, ``generate`` a batch) through one FIFO
queue and takes results from another; the worker never decides what to generate, so the trainer's bound on
staleness holds by construction. A worker that raises posts its error, which the trainer re-raises as its own
cause; one that hangs is found by the trainer's timeout, and its stack is quoted. The thread is a daemon: a hung
worker never keeps the process (or pytest) alive.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lit_entropy.functional.sampling import thread_generator
from lit_entropy.internals.threads import thread_stack

__all__ = ["Generated", "RolloutWorker", "RolloutWorkerError", "RolloutWorkerHung", "Sampled"]

#: How often the waiting trainer checks that the worker thread is still alive (seconds).
_POLL_S = 0.05


class RolloutWorkerError(RuntimeError):
    """The rollout worker raised; ``__cause__`` is its own exception (with its traceback)."""


class RolloutWorkerHung(RuntimeError):
    """The rollout worker delivered nothing within ``model.sampling.async_rollout.worker_timeout_s``."""


@dataclass(frozen=True)
class Generated:
    """One generated batch, as the worker hands it back.

    Attributes:
        ticket: the number the trainer gave the batch when it sent it (FIFO: results come back in that order).
        version: the policy version of the weights it was sampled with.
        output: what the generate function returned.
    """

    ticket: int
    version: int
    output: Any


@dataclass(frozen=True)
class Sampled:
    """What a generate function returns when its engine versions the weights itself (an engine in another process,
    which validation may also push to): the output and the version it was sampled with."""

    output: Any
    version: int


@dataclass(frozen=True)
class _Failure:
    error: BaseException


class RolloutWorker:
    """A daemon thread running ``load`` and ``generate`` commands in the order sent.

    Args:
        generate: ``generate(batch) -> output`` on the worker's current weights (runs on the worker thread); a
            :class:`Sampled` output carries its own version.
        load: ``load(weights, version)``: install pushed weights (runs on the worker thread, between generations).
        version: the version of the weights the worker starts with.
        threads: ``torch.set_num_threads`` on the worker thread (None: unchanged).
        generator: the worker thread's default sampling generator
            (:func:`~lit_entropy.functional.sampling.thread_generator`); None = the global one.
        name: the thread's name.
    """

    def __init__(
        self,
        generate: Callable[[Any], Any],
        load: Callable[[Any, int], None],
        *,
        version: int = 0,
        threads: int | None = None,
        generator: torch.Generator | None = None,
        name: str = "lit-entropy-rollout-worker",
    ) -> None:
        self.generate_fn, self.load_fn = generate, load
        self.version = version
        self.threads, self.generator = threads, generator
        self.commands: queue.Queue[tuple[str, Any, Any]] = queue.Queue()
        self.results: queue.Queue[Generated | _Failure] = queue.Queue()
        self.wait_s = 0.0  # seconds the worker sat idle waiting for a command since the last take_wait()
        self.wait_lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def submit(self, ticket: int, batch: Any) -> None:
        """Queue the generation of ``batch`` under ``ticket``."""
        self.commands.put(("generate", ticket, batch))

    def push(self, weights: Any, version: int) -> None:
        """Queue loading ``weights`` (a snapshot the trainer no longer changes) as version ``version``."""
        self.commands.put(("load", version, weights))

    def result(self, timeout_s: float) -> Generated:
        """The next generated batch, in submission order.

        Raises:
            RolloutWorkerError: the worker raised (the cause is its exception).
            RolloutWorkerHung: nothing came within ``timeout_s`` seconds (the worker's stack is in the message).
        """
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                item = self.results.get(timeout=min(_POLL_S, max(deadline - time.monotonic(), 0.0)))
            except queue.Empty:
                if not self.thread.is_alive() and self.results.empty():
                    raise RolloutWorkerError("the rollout worker thread ended without a result") from None
                if time.monotonic() >= deadline:
                    raise RolloutWorkerHung(
                        f"model.sampling.async_rollout.worker_timeout_s={timeout_s:g}: the rollout worker delivered "
                        f"no batch in {timeout_s:g} s; it is at:\n{self.stack()}"
                    ) from None
                continue
            if isinstance(item, _Failure):
                error = item.error
                raise RolloutWorkerError(
                    f"the rollout worker failed: {type(error).__name__}: {error} (its traceback is the cause above)"
                ) from error
            return item

    def take_wait(self) -> float:
        """Seconds the worker waited for commands since the previous call."""
        with self.wait_lock:
            out, self.wait_s = self.wait_s, 0.0
        return out

    def stack(self) -> str:
        """The worker thread's current Python stack (for a hung worker's error)."""
        return thread_stack(self.thread.ident)

    def close(self, timeout_s: float = 5.0) -> None:
        """Drop the commands not yet started, ask the worker to stop after its current one and wait up to
        ``timeout_s`` for it (a hung worker stays behind as a daemon thread)."""
        with self.commands.mutex:  # batches in flight at the end of a run are not generated for nothing
            self.commands.queue.clear()
        self.commands.put(("stop", None, None))
        if self.thread is not threading.current_thread():
            self.thread.join(timeout_s)

    def _run(self) -> None:
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        with thread_generator(self.generator):
            try:
                self._serve()
            except BaseException as error:  # noqa: BLE001 - every failure goes to the trainer, which raises it
                self.results.put(_Failure(error))

    def _serve(self) -> None:
        while True:
            idle = time.perf_counter()
            kind, key, payload = self.commands.get()
            with self.wait_lock:
                self.wait_s += time.perf_counter() - idle
            if kind == "stop":
                return
            if kind == "load":
                self.load_fn(payload, key)
                self.version = key
            else:
                output = self.generate_fn(payload)
                if isinstance(output, Sampled):
                    self.results.put(Generated(key, output.version, output.output))
                else:
                    self.results.put(Generated(key, self.version, output))

"""A rollout engine in a process of its own: how ``model.sampling.async_rollout`` runs the vLLM engine.

The trainer keeps a :class:`ProcessRolloutEngine`, a client. It spawns one child process that builds the wrapped
engine (a :class:`~lit_entropy.rollout.vllm.VLLMRolloutEngine` with the user's settings, in-process inside the
child) and serves its commands one at a time, in the order sent: ``load`` named weights as a version, ``generate``
a batch, ``stop``. Weights and rollouts cross as tensors in shared memory (``torch.multiprocessing``), weights as
``(Hugging Face name, full tensor)`` pairs the trainer copied when it pushed them (LoRA adapters merged), so the
trainer may change its own weights while the child still loads or samples.

Why a process of ours rather than vLLM's V1 multiprocessing engine core (``VLLM_ENABLE_V1_MULTIPROCESSING=1``):
that moves the scheduler and the model to a child, but the ``LLM`` front end (request loop, output processing)
stays in the trainer and takes its GIL while it polls, and ``collective_rpc("reload_weights")`` cannot carry the
trainer's weight iterator across the process boundary. In a child of ours all of vLLM is elsewhere: its CPU worker
binds OpenMP threads and replaces ``torch.set_num_threads`` process-wide, and it reseeds the process-global RNGs
when it starts, none of which then touches the trainer.

The client tracks the version of the weights the child holds (:attr:`ProcessRolloutEngine.version`); loads are
monotone (an older version than the one held is skipped), and :meth:`ProcessRolloutEngine.sample` returns the
version each batch was sampled with, read with the batch under one lock.
"""

from __future__ import annotations

import os
import threading
import traceback
from collections.abc import Iterable
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor, nn

from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig
from lit_entropy.rollout.weights import iter_hf_weights

__all__ = ["ProcessRolloutEngine", "RolloutEngineProcessError", "weight_snapshot"]

#: Seconds between the client's checks that the child is still alive while it waits for an answer.
_POLL_S = 0.1
#: The torchrun / Lightning rank variables: the child is one process of its own, never a rank of the trainer's group
#: (vLLM's engine would otherwise read them and try to join it).
_RANK_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_PORT")

Weights = list[tuple[str, Tensor]]


class RolloutEngineProcessError(RuntimeError):
    """The engine process failed (its traceback is in the message) or exited."""


def weight_snapshot(policy: nn.Module) -> Weights:
    """``(HF name, full tensor)`` copies of ``policy``'s weights (LoRA merged; FSDP2 shards all-gathered, a
    collective): what a push sends, unchanged by the trainer's later updates."""
    with torch.no_grad():
        return [(name, tensor.detach().to("cpu", copy=True)) for name, tensor in iter_hf_weights(policy)]


class ProcessRolloutEngine(RolloutEngine):
    """Run ``engine`` in a spawned child process (see the module docstring).

    Args:
        engine: the engine to host, not started (its ``generate`` must not need the policy once weights were
            loaded by name: :class:`~lit_entropy.rollout.vllm.VLLMRolloutEngine`).
        threads: ``torch.set_num_threads`` in the child before the engine starts (None: torch's default).

    Attributes:
        version: the version of the weights the child holds (None before the first load).
        current_version: the trainer's version now: :meth:`generate` (validation, from the trainer) pushes the
            policy first when the child holds another one.
        num_weight_pushes: loads the child performed.
    """

    reports_logprobs = True

    def __init__(self, engine: RolloutEngine, *, threads: int | None = None) -> None:
        if not hasattr(engine, "load_weights"):
            raise TypeError(f"{type(engine).__name__} cannot run in a process of its own: it has no load_weights")
        self.engine, self.threads = engine, threads
        self.version: int | None = None
        self.current_version = 0
        self.num_weight_pushes = 0
        self.lock = threading.Lock()  # one request at a time: the worker thread's and the trainer's (validation)
        self.process: Any = None
        self.connection: Any = None

    @property
    def pid(self) -> int | None:
        """The child's process id (None when not started)."""
        return None if self.process is None else self.process.pid

    def attach(
        self, model_name_or_path: str, eos_token_id: int | list[int] | None, pad_token_id: int, seed: int
    ) -> bool:
        """Spawn the child; it attaches (and so starts) the engine with these arguments. Returns once it is ready."""
        if self.process is not None:
            return False
        context = mp.get_context("spawn")
        self.connection, child = context.Pipe()
        attach = (model_name_or_path, eos_token_id, pad_token_id, seed)
        self.process = context.Process(
            target=serve, args=(self.engine, attach, self.threads, child, _this_gpu()),
            name="lit-entropy-rollout-engine", daemon=True,
        )  # fmt: skip
        self.process.start()
        child.close()
        self._answer()  # "ready", or the engine's start-up error
        return True

    def load(self, weights: Iterable[tuple[str, Tensor]], version: int) -> None:
        """Load ``weights`` (copies: :func:`weight_snapshot`) in the child as version ``version``; a version not
        newer than the one held is skipped (weights never go back)."""
        with self.lock:
            if self.version is not None and version <= self.version:
                return
            self._request("load", version, list(weights))
            self.version = version
            self.num_weight_pushes += 1

    def sample(self, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig) -> tuple[RolloutBatch, int]:
        """Generate in the child with the weights it holds; the batch and their version."""
        with self.lock:
            if self.version is None:
                raise RuntimeError("the rollout engine process was asked to sample before any weights were loaded")
            device = input_ids.device
            batch = self._request("generate", None, (input_ids.cpu(), attention_mask.cpu(), sampling))
            return _to(batch, device), self.version

    def generate(
        self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig
    ) -> RolloutBatch:
        """Sample from ``policy`` at :attr:`current_version` (pushed first when the child holds another version)."""
        if self.version != self.current_version:
            self.load(weight_snapshot(policy), self.current_version)
        return self.sample(input_ids, attention_mask, sampling)[0]

    def sync_weights(self, policy: nn.Module, step: int) -> None:
        """Make ``policy`` at ``step`` the current version and push it."""
        self.current_version = step
        self.load(weight_snapshot(policy), step)

    def close(self) -> None:
        """Stop the child (after its current command; killed if it does not end within 30 s)."""
        process, self.process = self.process, None
        if process is None:
            return
        try:
            if process.is_alive():
                self.connection.send(("stop", None, None))
        except (BrokenPipeError, OSError):
            pass
        process.join(30)
        if process.is_alive():
            process.kill()
            process.join(5)
        self.connection.close()
        self.version = None

    def _request(self, kind: str, key: Any, payload: Any) -> Any:
        if self.process is None:
            raise RuntimeError("the rollout engine process is not started (attach was not called, or it was closed)")
        try:
            self.connection.send((kind, key, payload))
        except (BrokenPipeError, OSError) as error:
            raise self._exited() from error
        return self._answer()

    def _answer(self) -> Any:
        """The child's next answer; its error, or its exit, raised as :class:`RolloutEngineProcessError`."""
        try:
            while not self.connection.poll(_POLL_S):
                if not self.process.is_alive():
                    raise self._exited()
            status, value = self.connection.recv()
        except (EOFError, OSError) as error:  # the child died mid-answer (a reset connection is an OSError)
            raise self._exited() from error
        if status == "error":
            raise RolloutEngineProcessError(f"the rollout engine process (pid {self.pid}) failed:\n{value}")
        return value

    def _exited(self) -> RolloutEngineProcessError:
        """The error for a child that is gone; the client is closed (a later request says it is not started)."""
        process, self.process = self.process, None
        process.join(1)
        self.connection.close()
        self.version = None
        return RolloutEngineProcessError(
            f"the rollout engine process (pid {process.pid}) exited with code {process.exitcode} "
            "(a negative code is the signal that ended it: -9 is SIGKILL, e.g. the kernel's out-of-memory killer)"
        )


def _to(batch: RolloutBatch, device: torch.device) -> RolloutBatch:
    if device.type == "cpu":
        return batch
    return RolloutBatch(
        sequences=batch.sequences.to(device), attention_mask=batch.attention_mask.to(device),
        response_mask=batch.response_mask.to(device),
        rollout_logprobs=None if batch.rollout_logprobs is None else batch.rollout_logprobs.to(device),
    )  # fmt: skip


def _this_gpu() -> str | None:
    """The physical id of this process's current CUDA device (what ``CUDA_VISIBLE_DEVICES`` names), None without
    CUDA: the child's engine shares the trainer rank's GPU (colocated; ``gpu_memory_utilization`` is its share)."""
    if not torch.cuda.is_available():
        return None
    current = torch.cuda.current_device()
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return visible.split(",")[current].strip() if visible else str(current)


def serve(engine: Any, attach: tuple[Any, ...], threads: int | None, connection: Any, gpu: str | None = None) -> None:
    """The child's main function: attach ``engine``, then answer ``(kind, key, payload)`` commands until ``stop``.
    ``gpu``: the only CUDA device the child sees (the trainer rank's), set before anything initialises CUDA."""
    for name in _RANK_VARIABLES:
        os.environ.pop(name, None)
    if gpu is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = gpu
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine in this process: it is the engine's process
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        engine.attach(*attach)
        answer: tuple[str, Any] = ("ready", os.getpid())
    except BaseException:  # noqa: BLE001 - every failure goes to the trainer, which raises it
        connection.send(("error", traceback.format_exc()))
        return
    connection.send(answer)
    try:
        while True:
            try:
                kind, key, payload = connection.recv()
            except EOFError:  # the trainer is gone
                return
            if kind == "stop":
                return
            try:
                if kind == "load":
                    engine.load_weights(payload, key)
                    answer = ("ok", None)
                else:
                    input_ids, attention_mask, sampling = payload
                    answer = ("ok", engine.generate(None, input_ids, attention_mask, sampling))
            except BaseException:  # noqa: BLE001 - sent to the trainer
                answer = ("error", traceback.format_exc())
            del payload
            connection.send(answer)
    finally:
        engine.close()

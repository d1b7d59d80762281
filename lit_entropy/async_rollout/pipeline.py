"""Where a training step's rollout comes from: generated in the step itself, or by a worker ahead of the trainer.

:class:`SynchronousRollouts` is ``model.sampling.async_rollout: null``: push the weights, generate the step's own batch.
:class:`AsyncRollouts` sends each step's prompts to a :class:`~lit_entropy.async_rollout.worker.RolloutWorker`
(a thread with its own copy of the policy) and trains on the batch sent ``depth`` steps earlier, which the
worker generated while the trainer updated. Versions count trained batches; a batch sent at version ``v`` trains
at ``v + depth`` and was sampled with the weights last pushed before it was sent, so
``weight_sync_steps <= max_staleness - depth + 1`` keeps every batch within ``max_staleness``
(:class:`~lit_entropy.async_rollout.config.AsyncRolloutConfig` refuses more). Nothing is dropped: the trainer
waits for the batch it needs, the worker for the next prompts.

Checkpoints hold the prompts sent but not yet trained on (the committed state: at the end of a step, or its
start for a checkpoint written from inside it), and the version; a resumed run sends them to its new worker
first, so it regenerates them with its own weights and trains on the same prompts in the same order.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from transformers import AutoModelForCausalLM

from lit_entropy.async_rollout.config import AsyncRolloutConfig
from lit_entropy.async_rollout.worker import RolloutWorker, Sampled
from lit_entropy.distributed.collectives import all_gather_counts, all_gather_objects, is_distributed
from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig
from lit_entropy.rollout.hf import HFRolloutEngine
from lit_entropy.rollout.process import ProcessRolloutEngine, weight_snapshot
from lit_entropy.rollout.vllm import VLLMRolloutEngine

__all__ = [
    "CHECKPOINT_KEY",
    "AsyncRollouts",
    "HostSettings",
    "RolloutHost",
    "RolloutSource",
    "SynchronousRollouts",
    "plain_copy",
    "rollout_source",
    "trained_weights",
]

Batch = dict[str, Any]
CHECKPOINT_KEY = "lit_entropy_async_rollout"


class HostSettings(Protocol):
    """What a rollout source reads of its host's settings (:class:`~lit_entropy.settings.RFTSettings`, which hold
    this package's own settings group: the package cannot import them)."""

    @property
    def sampling(self) -> SamplingConfig: ...


class RolloutHost(Protocol):
    """What a rollout source reads of the :class:`~lit_entropy.module.RFTModule` it serves."""

    policy: nn.Module | None
    rollout_engine: RolloutEngine
    settings: HostSettings
    multi_turn: Any  # model.sampling.multi_turn's MultiTurnRollout, or None

    @property
    def device(self) -> torch.device: ...

    @property
    def global_step(self) -> int: ...

    def generate(self, batch: Batch, sampling: Any) -> RolloutBatch: ...

    def log(self, name: str, value: Tensor, *, on_step: bool, batch_size: int) -> None: ...


class RolloutSource(Protocol):
    """The training step's rollouts: :meth:`take` before the update, :meth:`after_update` after it."""

    def take(self, host: RolloutHost, batch: Batch) -> tuple[Batch, RolloutBatch] | None: ...

    def after_update(self, host: RolloutHost) -> None: ...

    def on_train_end(self, trainer: Any) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class SynchronousRollouts:
    """``model.sampling.async_rollout: null``: each step pushes the weights (engines that keep their own) and samples
    its own batch from the current policy."""

    def take(self, host: RolloutHost, batch: Batch) -> tuple[Batch, RolloutBatch]:
        """The step's batch and its rollout (a resumed run's engine may hold the disk's weights: pushed if so)."""
        host.rollout_engine.sync_weights(_policy(host), host.global_step)
        return batch, host.generate(batch, host.settings.sampling)

    def after_update(self, host: RolloutHost) -> None:
        """Push the updated weights to the engine (a no-op for Hugging Face ``generate`` on the policy)."""
        host.rollout_engine.sync_weights(_policy(host), host.global_step)

    def on_train_end(self, trainer: Any) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """Nothing to restore; a checkpoint of an asynchronous run resumed synchronously drops its prompts in flight
        (with a warning)."""
        if checkpoint.get(CHECKPOINT_KEY):
            rank_zero_warn(
                "lit_entropy: the checkpoint holds prompts in flight of model.sampling.async_rollout, which this run "
                "does not set: they are not trained on"
            )

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Pending:
    """A batch of prompts sent to the worker and not yet trained on.

    Attributes:
        ticket: its number in the order sent (the worker answers in that order).
        batch: the collated prompts as the data loader gave them.
        version: the trainer's version when it was sent.
    """

    ticket: int
    batch: Batch
    version: int


def _policy(host: RolloutHost) -> nn.Module:
    if host.policy is None:
        raise RuntimeError("model.sampling.async_rollout: the policy is not loaded yet (configure_model has not run)")
    return host.policy


def plain_copy(policy: nn.Module, device: torch.device) -> nn.Module:
    """An unsharded Hugging Face model of ``policy``'s architecture on ``device`` holding its full weights (LoRA
    merged): the FSDP2 worker's copy. Every rank must call it (the weights are all-gathered)."""
    weights = dict(weight_snapshot(policy))
    model = AutoModelForCausalLM.from_config(policy.config)
    model.load_state_dict(weights)  # every entry: a tied head arrives under both of its names
    return model.to(device=device, dtype=next(iter(weights.values())).dtype)


def trained_weights(policy: nn.Module) -> dict[str, Tensor]:
    """The state-dict entries of ``policy`` an update can change: its trainable parameters and its buffers. A LoRA
    policy's frozen base (and any frozen layer) is left out: the worker's copy already holds it, and copying it at
    every push would cost the base's size in memory and time."""
    state = policy.state_dict(keep_vars=True)
    buffers = {name for name, _ in policy.named_buffers()}
    return {
        name: tensor.detach()
        for name, tensor in state.items()
        if name in buffers or (isinstance(tensor, nn.Parameter) and tensor.requires_grad)
    }


def _to(batch: Batch, device: torch.device | None) -> Batch:
    """``batch`` with its tensors on ``device`` (the CPU when None)."""
    return {k: v.to(device or "cpu") if isinstance(v, Tensor) else v for k, v in batch.items()}


class AsyncRollouts:
    """``model.sampling.async_rollout``: a worker generates ahead; the trainer trains on batches at most
    ``max_staleness`` versions old (see the module docstring).

    Args:
        config: the settings group.
    """

    def __init__(self, config: AsyncRolloutConfig) -> None:
        self.config = config
        self.worker: RolloutWorker | None = None
        self.shadow: nn.Module | None = None
        self.version = 0  # trained rollout batches
        self.pushed = 0  # the version of the weights last sent to the worker
        self.pending: deque[Pending] = deque()
        self.next_ticket = 0
        self.committed: tuple[int, list[Batch]] = (0, [])  # what a checkpoint holds: (version, prompts in flight)
        self.restored: list[Batch] = []
        self.stats: dict[str, float] = {}
        self.sharded = False  # FSDP2: the worker samples from a plain (unsharded) copy

    def start(self, host: RolloutHost) -> None:
        """Start the worker on the current weights; send a resumed run's prompts in flight first.

        Hugging Face ``generate``: the worker samples from its own copy of the policy. An engine in a process of its
        own (:class:`~lit_entropy.rollout.process.ProcessRolloutEngine`, the vLLM engine): the worker thread sends
        the child its commands, and the policy's weights are its first one.
        """
        engine, policy = host.rollout_engine, _policy(host)
        # FSDP2: the worker must not run the sharded forward (its all-gathers would interleave with the trainer's
        # collectives), so its copy is a plain model fed full weights, gathered by every rank at the same versions.
        self.sharded = getattr(host, "device_mesh", None) is not None
        sampling, self.pushed = host.settings.sampling, self.version
        generate: Callable[[Batch], Any]
        load: Callable[[Any, int], None]
        multi_turn = getattr(host, "multi_turn", None)
        if isinstance(engine, ProcessRolloutEngine):
            if multi_turn is not None:
                raise ValueError(
                    "model.sampling.async_rollout with model.sampling.multi_turn runs the environment loop in the "
                    "worker thread, on the Hugging Face engine only: the vLLM engine's process samples single "
                    "completions; leave model.rollout unset (Hugging Face generate) or set "
                    "model.sampling.async_rollout: null"
                )
            engine.current_version = self.version
            hosted = engine

            def generate(batch: Batch) -> Sampled:
                return Sampled(*hosted.sample(batch["input_ids"], batch["attention_mask"], sampling))

            load = hosted.load
            first: Any = weight_snapshot(policy)
        else:
            shadow = plain_copy(policy, host.device) if self.sharded else copy.deepcopy(policy)
            shadow.requires_grad_(False).eval()
            self.shadow, first = shadow, None

            def generate(batch: Batch) -> Any:
                if multi_turn is not None:  # the whole environment loop, every round on the worker's copy
                    return multi_turn.generate(engine, shadow, batch, sampling)
                return engine.generate(shadow, batch["input_ids"], batch["attention_mask"], sampling)

            def load(weights: dict[str, Tensor], version: int) -> None:
                shadow.load_state_dict(weights, strict=False)  # the trained weights only (trained_weights)
                engine.sync_weights(shadow, version)

        # Nothing runs concurrently at depth 0, so the worker samples from the global stream in the trainer's
        # order (the synchronous run's samples); with batches in flight it draws from a stream of its own.
        generator = None
        if self.config.depth:
            generator = torch.Generator(device=host.device).manual_seed(torch.initial_seed() + 1 + self.version)
        # worker_threads is the engine process's count there (ProcessRolloutEngine): the trainer's stays its own.
        threads = None if first is not None else self.config.worker_threads
        self.worker = RolloutWorker(generate, load, version=self.version, threads=threads, generator=generator)
        if first is not None:
            self.worker.push(first, self.version)
        restored, self.restored = self.restored, []
        for batch in restored:
            self.submit(_to(batch, host.device))

    def submit(self, batch: Batch) -> None:
        assert self.worker is not None
        self.pending.append(Pending(self.next_ticket, batch, self.version))
        self.worker.submit(self.next_ticket, batch)
        self.next_ticket += 1

    def take(self, host: RolloutHost, batch: Batch) -> tuple[Batch, RolloutBatch] | None:
        """Send ``batch``; return the oldest batch sent and its rollout, or None while the first ``depth`` batches
        are generated (no update in this step)."""
        if self.worker is None:
            self.start(host)
        assert self.worker is not None
        self.submit(batch)
        if len(self.pending) <= self.config.depth:
            self.commit()
            return None
        oldest = self.pending.popleft()
        waited = time.perf_counter()
        try:
            generated = self.worker.result(self.config.worker_timeout_s)
        except Exception:
            self.close()
            raise
        waited = time.perf_counter() - waited
        if generated.ticket != oldest.ticket:  # the worker answers in order: anything else is a bug here
            raise RuntimeError(f"rollout worker answered ticket {generated.ticket}, expected {oldest.ticket}")
        staleness = self.version - generated.version
        versions = all_gather_counts(generated.version, host.device)
        if len(set(versions)) > 1:
            raise RuntimeError(f"ranks sampled this batch with different policy versions: {versions}")
        if not 0 <= staleness <= self.config.max_staleness:
            raise RuntimeError(
                f"a batch of version {generated.version} reached the trainer at version {self.version}: outside "
                f"model.sampling.async_rollout.max_staleness={self.config.max_staleness}"
            )
        self.stats = {
            "staleness_mean": float(staleness), "staleness_max": float(staleness), "trainer_wait_s": waited,
            "worker_wait_s": self.worker.take_wait(), "queue_depth": float(len(self.pending)),
            "version": float(generated.version),
        }  # fmt: skip
        return oldest.batch, generated.output

    def after_update(self, host: RolloutHost) -> None:
        """One more version; push the weights at the sync points; log ``train/async/*``; commit."""
        assert self.worker is not None
        self.version += 1
        engine = host.rollout_engine
        if isinstance(engine, ProcessRolloutEngine):
            engine.current_version = self.version  # what validation from the trainer samples with
        if self.version - self.pushed >= self.config.weight_sync_steps:
            weights: Any
            if isinstance(engine, ProcessRolloutEngine):  # copies (LoRA merged) the child loads as they are
                weights = weight_snapshot(_policy(host))
            elif self.sharded:  # full copies (all-gathered: every rank pushes at the same versions) for the plain copy
                weights = dict(weight_snapshot(_policy(host)))
            else:
                weights = trained_weights(_policy(host))
                if self.config.depth:  # the trainer changes its weights while the worker still samples: a snapshot
                    weights = {name: tensor.detach().clone() for name, tensor in weights.items()}
            self.worker.push(weights, self.version)
            self.pushed = self.version
        for name, value in self.stats.items():
            host.log(f"train/async/{name}", torch.tensor(value), on_step=True, batch_size=1)
        self.commit()

    def on_train_end(self, trainer: Any) -> None:
        """Warn when the run ran out of epochs (``trainer.max_epochs``, or the end of an iterable loader) with batches
        still in flight: they were sent to the worker and never trained on. A run that stops at ``max_steps`` got
        the updates it asked for; either way a checkpoint written at the end holds them and a run resumed from it
        trains them first."""
        if not self.pending or trainer is None or (0 <= trainer.max_steps <= trainer.global_step):
            return
        epochs = trainer.max_epochs
        batches, prompts = len(self.pending), sum(len(p.batch["input_ids"]) for p in self.pending)
        per_epoch = trainer.num_training_batches
        recipe = (
            f"trainer.max_epochs={epochs + 1} with trainer.max_steps={epochs * per_epoch} trains every prompt of "
            f"{epochs} epoch(s) ({per_epoch} batches each)"
            if isinstance(epochs, int) and epochs > 0 and isinstance(per_epoch, int)
            else "a trainer.max_steps limit stops after as many updates as it names"
        )
        rank_zero_warn(
            f"lit_entropy: the run ran out of data (trainer.max_epochs={epochs}) with {batches} batch(es) "
            f"({prompts} prompts per rank) sent to the rollout worker and not trained on "
            f"(model.sampling.async_rollout keeps {self.config.depth} in flight); a checkpoint written at the end "
            f"holds them and a run resumed from it trains them first. {recipe}"
        )

    def commit(self) -> None:
        """The state a checkpoint holds from now on (a checkpoint from inside the next step describes its start)."""
        self.committed = (self.version, [p.batch for p in self.pending])

    def state_dict(self) -> dict[str, Any]:
        """``{CHECKPOINT_KEY: every rank's (version, prompts in flight)}`` (collective under DDP)."""
        version, batches = self.committed
        mine = {"version": version, "batches": [_to(batch, None) for batch in batches]}
        return {CHECKPOINT_KEY: all_gather_objects(mine) if is_distributed() else [mine]}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """This rank's version and prompts in flight, sent to the worker when it starts."""
        states = checkpoint.get(CHECKPOINT_KEY)
        if not states:
            return
        rank, world = (torch.distributed.get_rank(), torch.distributed.get_world_size()) if is_distributed() else (0, 1)
        mine = states[rank] if len(states) == world else states[0]
        if len(states) != world:
            rank_zero_warn(
                f"lit_entropy: the checkpoint's prompts in flight are of {len(states)} ranks, not {world}: dropped"
            )
            mine = {"version": mine["version"], "batches": []}
        self.version = self.pushed = int(mine["version"])
        self.committed = (self.version, list(mine["batches"]))
        self.restored = list(mine["batches"])

    def close(self) -> None:
        """Stop the worker (a hung one stays behind as a daemon thread)."""
        if self.worker is not None:
            self.worker.close()
            self.worker = None


def rollout_source(config: AsyncRolloutConfig | None, engine: RolloutEngine) -> tuple[RolloutSource, RolloutEngine]:
    """The rollout source and the engine the module uses: :class:`SynchronousRollouts` and ``engine`` without
    ``model.sampling.async_rollout``; with it :class:`AsyncRollouts`, and the vLLM engine moved into a process of its
    own (:class:`~lit_entropy.rollout.process.ProcessRolloutEngine`, started by the module's ``setup``).

    Raises:
        ValueError: ``model.sampling.async_rollout`` with an engine other than Hugging Face ``generate`` or vLLM.
    """
    if config is None:
        return SynchronousRollouts(), engine
    if isinstance(engine, VLLMRolloutEngine):
        return AsyncRollouts(config), ProcessRolloutEngine(engine, threads=config.worker_threads)
    if not isinstance(engine, HFRolloutEngine):
        raise ValueError(
            f"model.sampling.async_rollout needs model.rollout: null (Hugging Face generate on the worker's copy of "
            f"the policy) or a VLLMRolloutEngine (in a process of its own); model.rollout={type(engine).__name__} is "
            "not supported in this mode"
        )
    return AsyncRollouts(config), engine

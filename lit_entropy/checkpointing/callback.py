"""Exact resume: RNG states in checkpoints, atomic checkpoint files, a checkpoint on Ctrl-C / SIGTERM / requeue.

Lightning restores the model, optimizer, LR scheduler, loop progress, callback states and (for a stateful
loader, :class:`~lit_entropy.data.sampler.ResumableDataLoader`) the data position. It does not save the
global RNG states, and rollouts sample from them, so :class:`ResumableCheckpointing` stores every rank's
torch / CUDA / numpy / Python RNG state and restores it when training starts again. The module adds this
callback itself (``RFTModule.configure_callbacks``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn

from lit_entropy.checkpointing.atomic_io import AtomicCheckpointIO
from lit_entropy.checkpointing.fingerprint import CHECKPOINT_KEY as FINGERPRINT_KEY
from lit_entropy.checkpointing.fingerprint import data_fingerprint
from lit_entropy.checkpointing.rng import get_rng_state, set_rng_state
from lit_entropy.internals.lightning import (
    cluster_environment,
    hpc_checkpoint_path,
    last_saved_step,
    load_pending_loader_states,
    mark_saved_step,
    rewind_logger_step,
    saved_loader_states,
)

__all__ = ["ResumableCheckpointing", "RunInterrupted", "resume_hint", "take_interruption"]

_RNG_KEY = "lit_entropy_rng_states"
# Pending stop requests, ordered: the larger one wins when ranks disagree.
_STOP_INTERRUPT = 1  # SIGTERM, or Ctrl-C with several processes: <log_dir>/checkpoints/interrupted.ckpt
_STOP_REQUEUE = 2  # SLURM requeue signal: Lightning's hpc_ckpt_N.ckpt, then scontrol requeue


class RunInterrupted(SystemExit):
    """``fit`` stopped by a signal (SIGTERM, SIGINT, the SLURM requeue signal) after its resumable checkpoint.

    A ``SystemExit`` with the shells' status for a process ended by a signal, ``128 + signum`` (143 for
    SIGTERM, 130 for SIGINT): a scheduler or script never reads an interrupted run as finished, and a
    script that does not catch it exits with that status. No validation or export follows the checkpoint.

    Args:
        signum: the signal that stopped the run.
        path: the checkpoint written, or None (interrupted before the first training batch).
    """

    def __init__(self, signum: int, path: Path | None) -> None:
        super().__init__(128 + int(signum))
        self.signum = int(signum)
        self.path = path

    def __str__(self) -> str:
        return f"interrupted by {signal.Signals(self.signum).name}"


# The interruption of this process's latest fit, for the command line: Lightning ends a Ctrl-C with
# sys.exit(1) after the callbacks' on_exception, so the status 130 is set by the caller.
_last_interruption: RunInterrupted | None = None


def take_interruption() -> RunInterrupted | None:
    """The :class:`RunInterrupted` recorded by this process's latest interrupted ``fit`` (then forgotten), or None."""
    global _last_interruption
    interruption, _last_interruption = _last_interruption, None
    return interruption


def resume_hint(trainer: Trainer, path: Path, signum: int) -> str:
    """The one line every interruption prints: what stopped the run, the checkpoint, the command that resumes it."""
    run_config = Path(trainer.log_dir) / "config.yaml" if trainer.log_dir else None
    config = f" --config {run_config}" if run_config is not None and run_config.is_file() else ""
    return (
        f"lit_entropy: interrupted by {signal.Signals(signum).name}; resumable checkpoint written to {path}; "
        f"no validation or export. Resume with: lit-entropy fit{config} --ckpt_path {path}"
    )


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class ResumableCheckpointing(Callback):
    """RNG states in checkpoints, atomic checkpoint files, a resumable checkpoint on Ctrl-C.

    * ``setup``: installs :class:`AtomicCheckpointIO` when the strategy uses the plain ``TorchCheckpointIO``
      (a user's own CheckpointIO is kept).
    * ``on_save_checkpoint``: stores every rank's RNG state (gathered: only rank 0 writes the file).
    * ``on_load_checkpoint`` / ``on_train_start``: restores this rank's RNG state just before the first
      resumed batch, so rollouts sample what the uninterrupted run sampled.
    * validation inside ``fit`` leaves the training RNG stream unchanged (state taken at the end of the
      training batch, restored after validation), so a checkpoint written before or after a validation
      pass, and a resumed run that repeats or skips one, continue the same training stream.
    * SIGTERM (what SLURM, Kubernetes and ``timeout`` send), and Ctrl-C with several processes: a handler
      (main thread) only records the request; at the end of the current training batch the ranks agree on
      it (one all-reduce per batch), all of them write ``<log_dir>/checkpoints/interrupted.ckpt`` together
      (saving is collective under FSDP2) and the run stops cleanly; resuming from it continues exactly. A
      second Ctrl-C interrupts at once, as usual.
    * SLURM with Lightning's ``SLURMEnvironment(auto_requeue=True)`` (its default under SLURM): the requeue
      signal (SIGUSR1; ``sbatch --signal=USR1@<seconds>``) is handled the same way, but the checkpoint is
      Lightning's ``<default_root_dir>/hpc_ckpt_<N>.ckpt`` and rank 0 then runs ``scontrol requeue``; the
      requeued job resumes from it without ``--ckpt_path`` (Lightning picks the newest ``hpc_ckpt``).
    * ``on_exception`` with ``KeyboardInterrupt`` (single process): writes ``<log_dir>/checkpoints/interrupted.ckpt``.
      When the interrupt lands inside a training batch the checkpoint describes the state at the start of
      that batch (RNG state and data position rewound), so the resumed run redoes the batch. Optimizer
      steps already taken within the batch (several mini-batches) are kept; with one update per batch
      (the GRPO default) an interrupt before the step resumes exactly.

    Args:
        interrupt_checkpoint: write the Ctrl-C / SIGTERM / requeue checkpoints (and install the handlers).
        atomic_io: install :class:`AtomicCheckpointIO`.
    """

    def __init__(self, interrupt_checkpoint: bool = True, atomic_io: bool = True) -> None:
        self.interrupt_checkpoint = interrupt_checkpoint
        self.atomic_io = atomic_io
        self.interrupted_path: Path | None = None
        self._pending: list[dict[str, Any]] | None = None
        self._step_start_state: dict[str, Any] | None = None
        self._val_state: dict[str, Any] | None = None
        self._saving_mid_step = False
        self._stop_code = 0  # (request kind) * 256 + signal number; the larger request wins
        self._previous_handlers: dict[int, Any] = {}
        self._interruption: RunInterrupted | None = None  # checkpoint written, the stop not raised yet

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        strategy = trainer.strategy
        if self.atomic_io and type(strategy.checkpoint_io) is TorchCheckpointIO:
            strategy.checkpoint_io = AtomicCheckpointIO()

    # -------------------------------------------------------------- RNG state
    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        if self._saving_mid_step:
            state = self._step_start_state
        elif trainer.validating and self._val_state is not None:
            state = self._val_state  # interrupted inside validation: the training stream it will restore
        else:
            state = get_rng_state()
        rank, world = _world()
        states: list[Any] = [state]
        if world > 1:
            states = [None] * world
            dist.all_gather_object(states, state)
        checkpoint[_RNG_KEY] = states
        fingerprint = data_fingerprint(getattr(getattr(trainer, "datamodule", None), "train_dataset", None))
        if fingerprint is not None:
            checkpoint[FINGERPRINT_KEY] = fingerprint
        if self._saving_mid_step:
            _rewind_loader_position(checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict[str, Any]) -> None:
        self._pending = checkpoint.get(_RNG_KEY)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._interruption = None
        load_pending_loader_states(trainer)
        if self._pending:
            rank, world = _world()
            if len(self._pending) != world:
                rank_zero_warn(
                    f"the checkpoint holds RNG states of {len(self._pending)} ranks but this run has {world}: "
                    "rank r takes state r mod saved ranks, so rollouts will not repeat the original run's"
                )
            set_rng_state(self._pending[rank % len(self._pending)])
            self._pending = None
        # A resumed run may validate before its first batch (Lightning repeats an interrupted check).
        self._val_state = get_rng_state()
        self._install_signal_handlers(trainer)

    # ---------------------------------------------------- signals (Ctrl-C, SIGTERM, SLURM requeue)
    def _install_signal_handlers(self, trainer: Trainer) -> None:
        """Handlers that only record a request; the ranks act on it together at the end of the batch.

        SIGTERM (preemption, ``timeout``, Kubernetes) always; SIGINT with several processes (a single
        process takes Lightning's KeyboardInterrupt path, see ``on_exception``); the SLURM requeue signal
        (SIGUSR1 by default) when Lightning's ``SLURMEnvironment(auto_requeue=True)`` is active. These
        replace Lightning's own SIGTERM / SIGUSR1 handlers for the duration of training: Lightning's save
        a checkpoint from inside the signal handler, in the middle of a step (collectives under FSDP2
        could hang) and not resumable exactly.
        """
        self._stop_code = 0
        if not self.interrupt_checkpoint or threading.current_thread() is not threading.main_thread():
            return
        wanted = {signal.SIGTERM: _STOP_INTERRUPT}
        if trainer.world_size > 1:
            wanted[signal.SIGINT] = _STOP_INTERRUPT
        environment = cluster_environment(trainer)
        if isinstance(environment, SLURMEnvironment) and environment.auto_requeue and hasattr(signal, "SIGUSR1"):
            wanted[environment.requeue_signal or signal.SIGUSR1] = _STOP_REQUEUE
        for signum, code in wanted.items():
            self._previous_handlers[signum] = signal.signal(signum, self._make_handler(code))

    def _make_handler(self, code: int) -> Any:
        def handler(signum: int, frame: Any) -> None:
            self._stop_code = max(self._stop_code, code * 256 + int(signum))
            if signum == signal.SIGINT:  # the next Ctrl-C goes to the previous handler (KeyboardInterrupt at once)
                signal.signal(signal.SIGINT, self._previous_handlers.get(signum) or signal.default_int_handler)

        return handler

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous_handlers.items():
                signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        self._previous_handlers = {}

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_if_interrupted()

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_if_interrupted()

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_if_interrupted()  # before the module's on_train_end exports
        self._restore_signal_handlers()
        _refresh_last_checkpoints(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._restore_signal_handlers()

    def _act_on_stop_request(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """At the end of a training batch: agree on a pending request, save together, stop (or requeue)."""
        if not self._previous_handlers:
            return
        # Every rank joins, so all of them see a signal that reached any of them.
        code = torch.tensor([float(self._stop_code)], device=pl_module.device)
        if _world()[1] > 1:
            dist.all_reduce(code, op=dist.ReduceOp.MAX)
        code_value, signum = divmod(int(code.item()), 256)
        if code_value == 0:
            return
        if code_value == _STOP_REQUEUE:
            # Lightning resumes a requeued SLURM job from the newest hpc_ckpt_N.ckpt of default_root_dir.
            path = hpc_checkpoint_path(trainer)
        else:
            path = _interrupt_checkpoint_path(trainer)
        trainer.save_checkpoint(path, weights_only=False)  # a full, resumable checkpoint
        self.interrupted_path = path
        self._stop_code = 0
        if code_value == _STOP_REQUEUE:
            if trainer.is_global_zero:
                _slurm_requeue()
            rank_zero_info(f"lit_entropy: requeue signal; checkpoint written to {path}, SLURM job requeued")
        else:
            rank_zero_info(resume_hint(trainer, path, signum))
        # Not trainer.should_stop: Lightning would then validate and the module export a half-trained policy,
        # and the process would exit 0 as if the run had finished. Raised at the next hook (the next batch, a
        # validation, the end of the epoch or of training), after Lightning logged this batch's scalars.
        self._restore_signal_handlers()
        self._interruption = RunInterrupted(signum, path)

    def _stop_if_interrupted(self) -> None:
        interruption, self._interruption = self._interruption, None
        if interruption is not None:
            raise _record(interruption)

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int) -> None:
        self._stop_if_interrupted()
        self._step_start_state = get_rng_state()

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self._step_start_state = None
        # Snapshot before a validation pass can start: Lightning creates the validation iterator (a draw
        # from the global RNG) before any validation hook runs.
        self._val_state = get_rng_state()
        self._act_on_stop_request(trainer, pl_module)

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._val_state = get_rng_state()

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._val_state is not None and trainer.state.fn == "fit":
            set_rng_state(self._val_state)
        self._val_state = None

    # ----------------------------------------------------------------- Ctrl-C
    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._restore_signal_handlers()
        if not isinstance(exception, KeyboardInterrupt):
            return
        if not self.interrupt_checkpoint or trainer.state.fn != "fit":
            _record(RunInterrupted(signal.SIGINT, None))
            return
        if trainer.world_size > 1:
            # Saving is collective (FSDP2 gathers shards); ranks interrupted at different points would hang.
            rank_zero_warn(
                "KeyboardInterrupt with several processes (a second Ctrl-C, or one outside the training loop):"
                " no interrupt checkpoint written"
            )
            _record(RunInterrupted(signal.SIGINT, None))
            return
        if trainer.global_step == 0 and self._step_start_state is None:
            _record(RunInterrupted(signal.SIGINT, None))
            return
        path = _interrupt_checkpoint_path(trainer)
        self._saving_mid_step = self._step_start_state is not None
        try:
            trainer.save_checkpoint(path, weights_only=False)  # a full, resumable checkpoint
        finally:
            self._saving_mid_step = False
        self.interrupted_path = path
        rank_zero_info(resume_hint(trainer, path, signal.SIGINT))
        _record(RunInterrupted(signal.SIGINT, path))


def _record(interruption: RunInterrupted) -> RunInterrupted:
    global _last_interruption
    _last_interruption = interruption
    return interruption


def _refresh_last_checkpoints(trainer: Trainer) -> None:
    """Rewrite each ModelCheckpoint's ``last.ckpt`` (``save_last``) when the run ended after its latest save.

    Lightning saves ``last`` with its other checkpoints (after validation or at an epoch end), so a
    ``max_steps`` run that stops between two of them would otherwise keep an older ``last.ckpt`` than the
    final weights (which ``fit`` exports). Collective: every rank runs it.
    """
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint) or not callback.save_last or callback.dirpath is None:
            continue
        if last_saved_step(callback) == trainer.global_step or trainer.global_step == 0:
            continue
        path = str(Path(callback.dirpath) / f"{callback.CHECKPOINT_NAME_LAST}{callback.FILE_EXTENSION}")
        trainer.save_checkpoint(path, weights_only=callback.save_weights_only)
        callback.last_model_path = path
        mark_saved_step(callback, trainer.global_step)


def _slurm_requeue() -> None:
    """``scontrol requeue <job>`` as Lightning's SLURM handler does (array jobs as ``<job>_<task>``)."""
    array_job = os.getenv("SLURM_ARRAY_JOB_ID")
    job = f"{array_job}_{os.environ['SLURM_ARRAY_TASK_ID']}" if array_job else os.environ.get("SLURM_JOB_ID", "")
    if not re.fullmatch(r"[0-9_]+", job):
        rank_zero_warn(f"lit_entropy: cannot requeue: SLURM job id {job!r} is not set or malformed")
        return
    try:
        result = subprocess.call(["scontrol", "requeue", job])
    except FileNotFoundError:
        rank_zero_warn("lit_entropy: cannot requeue: scontrol is not on PATH")
        return
    if result != 0:
        rank_zero_warn(f"lit_entropy: scontrol requeue {job} failed with exit code {result}")


def _interrupt_checkpoint_path(trainer: Trainer) -> Path:
    return Path(trainer.log_dir or trainer.default_root_dir) / "checkpoints" / "interrupted.ckpt"


def _rewind_loader_position(checkpoint: dict[str, Any]) -> None:
    """Mark the batch in progress as not consumed (Lightning's progress counters already exclude it).

    Lightning adds one to the logging step when it resumes a batch that had not ended; the interrupted
    batch had not stepped either, so take it back.
    """
    rewind_logger_step(checkpoint)
    for state in saved_loader_states(checkpoint):
        if isinstance(state, dict) and {"epoch", "batches", "batch_size", "num_replicas"} <= set(state):
            state["batches"] = max(0, int(state["batches"]) - 1)

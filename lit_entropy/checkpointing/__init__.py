"""Exact resume and safe checkpoints: atomic writes, RNG states, a resumable checkpoint on Ctrl-C / SIGTERM /
requeue (:class:`ResumableCheckpointing`, which :class:`~lit_entropy.module.RFTModule` adds itself)."""

from lit_entropy.checkpointing.atomic_io import (
    AtomicCheckpointIO,
    DiskFullError,
    atomic_directory_replace,
    disk_full_message,
    remove_stale_temporaries,
    temporary_name,
)
from lit_entropy.checkpointing.callback import ResumableCheckpointing, RunInterrupted, take_interruption
from lit_entropy.checkpointing.rng import get_rng_state, set_rng_state

__all__ = [
    "AtomicCheckpointIO",
    "DiskFullError",
    "ResumableCheckpointing",
    "RunInterrupted",
    "atomic_directory_replace",
    "disk_full_message",
    "get_rng_state",
    "remove_stale_temporaries",
    "set_rng_state",
    "take_interruption",
    "temporary_name",
]

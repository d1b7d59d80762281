"""Asynchronous rollouts with bounded staleness (``model.sampling.async_rollout``): generation overlaps the update."""

from lit_entropy.async_rollout.config import STALENESS_CORRECTION, AsyncRolloutConfig
from lit_entropy.async_rollout.pipeline import AsyncRollouts, RolloutSource, SynchronousRollouts, rollout_source
from lit_entropy.async_rollout.worker import RolloutWorker, RolloutWorkerError, RolloutWorkerHung

__all__ = [
    "STALENESS_CORRECTION",
    "AsyncRolloutConfig",
    "AsyncRollouts",
    "RolloutSource",
    "RolloutWorker",
    "RolloutWorkerError",
    "RolloutWorkerHung",
    "SynchronousRollouts",
    "rollout_source",
]

"""``model.sampling.async_rollout``: generate the next batches while the trainer updates, within a bound on staleness.

A part of the training rollouts' settings (:class:`~lit_entropy.settings.TrainingSamplingConfig`), which turn on
the rollout correction this mode defaults to (:meth:`AsyncRolloutConfig.corrected`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from lit_entropy.functional.checks import check_number
from lit_entropy.rollout.correction import RolloutCorrectionConfig

__all__ = ["STALENESS_CORRECTION", "AsyncRolloutConfig"]

#: The rollout correction a run with ``max_staleness > 0`` gets when ``model.loss.rollout_correction.level`` is
#: null: token-level truncated importance weights ``min(pi_current / pi_sampled, 2)`` (TIS, as NeMo-RL's async
#: GRPO and verl's fully-async recipe default to); bounded, so one very stale token cannot dominate a batch.
STALENESS_CORRECTION = RolloutCorrectionConfig(level="token", mode="truncate", upper=2.0)


@dataclass(frozen=True)
class AsyncRolloutConfig:
    """A rollout worker (a thread with its own copy of the policy; with the vLLM engine, a thread that drives the
    engine in a process of its own) generates up to ``max_inflight`` batches ahead of the one the trainer updates
    on. A policy version counts trained rollout batches; every sample carries the
    version it was sampled with, and a batch is trained only within ``max_staleness`` versions of it (the worker
    waits for the trainer, nothing is dropped)."""

    max_staleness: int = 1
    """Most policy versions (trained batches) between the weights a batch was sampled with and the weights it
    trains: 0 = synchronous (the same samples and weights as ``model.sampling.async_rollout: null``), 1 = one-step
    off-policy (verl's ``one_step_off_policy``)."""
    max_inflight: int = 1
    """Batches the worker generates ahead of the one being trained, capped at ``max_staleness`` (a deeper queue
    would train samples older than the bound). The first ones are generated before the first update."""
    weight_sync_steps: int = 1
    """Push the trainer's weights to the worker every this many versions; at most
    ``max_staleness - min(max_inflight, max_staleness) + 1``, so every batch stays within the bound."""
    correct_staleness: bool = True
    """With ``max_staleness > 0`` and ``model.loss.rollout_correction.level`` null, turn the correction on as
    token-level truncated importance weights with ``upper`` 2 (``pi_current / pi_sampled``, where the statistics
    pass on the current weights is the proximal policy); false = train the stale samples uncorrected."""
    worker_timeout_s: float = 600.0
    """Seconds the trainer waits for the worker's next batch before stopping the run with the worker's stack (a
    hung worker); a worker that raises stops it at once with its own error."""
    worker_threads: int | None = None
    """``torch.set_num_threads`` when the worker starts. PyTorch's count is process-wide, so the trainer's parallel
    regions get it too: each of the two threads then runs its own regions of this many threads (1 on two cores
    gives generation one core and the update the other); with the vLLM engine it is the engine process's count
    only, the trainer's is its own; null = the process's setting."""

    def __post_init__(self) -> None:
        prefix = "model.sampling.async_rollout."
        check_number(f"{prefix}max_staleness", self.max_staleness, low=0, integer=True)
        check_number(f"{prefix}max_inflight", self.max_inflight, low=1, integer=True)
        check_number(f"{prefix}weight_sync_steps", self.weight_sync_steps, low=1, integer=True)
        check_number(f"{prefix}worker_timeout_s", self.worker_timeout_s, low=0, low_open=True)
        check_number(f"{prefix}worker_threads", self.worker_threads, low=1, integer=True, optional=True)
        if self.weight_sync_steps > self.max_sync_interval:
            raise ValueError(
                f"{prefix}weight_sync_steps={self.weight_sync_steps} would let the worker sample with weights "
                f"older than {prefix}max_staleness={self.max_staleness} allows with {self.depth} batch(es) in "
                f"flight: at most {self.max_sync_interval}"
            )

    @property
    def depth(self) -> int:
        """Batches in flight ahead of the trained one: ``min(max_inflight, max_staleness)``."""
        return min(self.max_inflight, self.max_staleness)

    @property
    def max_sync_interval(self) -> int:
        """The longest push interval that keeps every trained batch within ``max_staleness``: a batch submitted
        at version ``v`` trains at ``v + depth`` and is sampled with the last pushed weights."""
        return self.max_staleness - self.depth + 1

    def corrected(self, correction: RolloutCorrectionConfig) -> RolloutCorrectionConfig:
        """``model.loss.rollout_correction`` for this mode: :data:`STALENESS_CORRECTION` when stale samples are
        trained, ``correct_staleness`` is on and the user's is off; else the user's."""
        if self.max_staleness == 0 or not self.correct_staleness or correction.enabled:
            return correction
        return replace(STALENESS_CORRECTION, kept_set_logprobs=correction.kept_set_logprobs)

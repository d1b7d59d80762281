"""Rollout engines: sample completions from the current policy."""

from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids
from lit_entropy.rollout.hf import HFRolloutEngine
from lit_entropy.rollout.vllm import VLLMRolloutEngine


def default_rollout_engine(engine: RolloutEngine | None) -> RolloutEngine:
    """``engine``, or Hugging Face ``generate`` on the policy when None (``model.rollout: null``).

    Raises:
        TypeError: ``engine`` is neither a :class:`RolloutEngine` nor None (e.g. a pre-0.2 name like ``"vllm"``).
    """
    if engine is None:
        return HFRolloutEngine()
    if not isinstance(engine, RolloutEngine):
        raise TypeError(
            f"model.rollout must be a lit_entropy.rollout.RolloutEngine (class_path) or null, got {engine!r}"
        )
    return engine


__all__ = [
    "HFRolloutEngine",
    "VLLMRolloutEngine",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingConfig",
    "response_mask_from_ids",
]

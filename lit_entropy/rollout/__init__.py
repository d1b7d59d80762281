"""Rollout engines: sample completions from the current policy."""

from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids
from lit_entropy.rollout.hf import HFRolloutEngine

__all__ = ["HFRolloutEngine", "RolloutBatch", "RolloutEngine", "SamplingConfig", "response_mask_from_ids"]

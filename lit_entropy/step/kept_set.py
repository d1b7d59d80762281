"""The trainer's probability mass in the set top-k / top-p keep, for comparing its log-probs with an engine's."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_entropy.functional.rollout_correction import kept_log_mass
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import RFTSettings
from lit_entropy.step.forward import response_logits

__all__ = ["kept_set_log_mass"]


@torch.no_grad()
def kept_set_log_mass(model: nn.Module, rollout: RolloutBatch, settings: RFTSettings) -> Tensor | None:
    """``log`` of the mass ``softmax(logits / T)`` puts on the tokens ``model.sampling``'s top-k / top-p keep, at
    each response position ``[n, T]`` (float32, 0 outside the response mask); None unless
    ``model.rollout_correction.kept_set_logprobs`` is on, a filter is on and the engine reported log-probs.

    One more full-logits forward of ``model`` over the rows (no graph).
    """
    sampling = settings.sampling
    filtered = sampling.top_k > 0 or sampling.top_p < 1.0
    if not (settings.rollout_correction.kept_set_logprobs and filtered and rollout.rollout_logprobs is not None):
        return None
    mask = rollout.response_mask
    logits, _ = response_logits(model, rollout.sequences, rollout.attention_mask, mask.shape[1])
    filters = {"top_k": sampling.top_k, "top_p": sampling.top_p}
    # One row at a time: the sort behind top-p holds a [T, V] copy and its int64 order.
    out = torch.stack([kept_log_mass(row.float() / sampling.temperature, **filters) for row in logits])
    return out.masked_fill(~mask, 0.0)

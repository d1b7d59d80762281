"""Rollout batches with mixed prompt and response lengths on the tiny Qwen2, for the micro-batch and packing tests."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_entropy.rollout import RolloutBatch
from lit_entropy.step import Experience

PAD = 0


def mixed_rollout(
    vocab: int, prompt_lens: list[int], response_lens: list[int], *, seed: int = 0, width: int | None = None
) -> RolloutBatch:
    """Rows of real prompt / response lengths ``prompt_lens`` / ``response_lens``: prompts left-padded to the
    longest, responses right-padded to ``width`` (default: the longest) with ``PAD``, ids drawn from 3..vocab-1."""
    gen = torch.Generator().manual_seed(seed)
    n, p_max = len(prompt_lens), max(prompt_lens)
    t_max = width or max(response_lens)
    sequences = torch.randint(3, vocab, (n, p_max + t_max), generator=gen)
    attention = torch.zeros(n, p_max + t_max, dtype=torch.long)
    response_mask = torch.zeros(n, t_max, dtype=torch.bool)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        attention[i, p_max - p : p_max + r] = 1
        response_mask[i, :r] = True
    sequences = sequences.masked_fill(attention == 0, PAD)
    return RolloutBatch(sequences=sequences, attention_mask=attention, response_mask=response_mask)


def random_experience(model: nn.Module, rollout: RolloutBatch, *, seed: int = 1) -> Experience:
    """An experience of ``rollout`` whose old / reference log-probs are the model's own plus noise (ratios near 1,
    some clipped), random advantages and penalties, and a loss mask that drops some response tokens."""
    from lit_entropy.step import response_forward

    gen = torch.Generator().manual_seed(seed)
    mask = rollout.response_mask
    with torch.no_grad():
        logprobs = response_forward(model, rollout, temperature=1.0).stats.logprobs
    noise = lambda scale: scale * torch.randn(mask.shape, generator=gen, dtype=logprobs.dtype)  # noqa: E731
    n = mask.shape[0]
    keep = torch.rand(mask.shape, generator=gen) > 0.2
    tensors: dict[str, Tensor | None] = {
        "rewards": torch.rand(n, generator=gen, dtype=logprobs.dtype),
        "advantages": torch.randn(n, 1, generator=gen, dtype=logprobs.dtype).expand_as(logprobs) + noise(0.3),
        "old_logprobs": (logprobs + noise(0.2)).masked_fill(~mask, 0.0),
        "entropy": torch.zeros_like(logprobs),
        "discriminator": torch.zeros_like(logprobs),
        "ref_logprobs": (logprobs + noise(0.3)).masked_fill(~mask, 0.0),
        "loss_mask": mask & keep,
        "penalty": 0.1 * torch.rand(mask.shape, generator=gen, dtype=logprobs.dtype),
    }
    return Experience.from_row_tensors(tensors, rollout=rollout)

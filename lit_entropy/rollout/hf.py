"""Rollouts with Hugging Face ``generate`` on the training policy itself (KV cache, left padding)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids

__all__ = ["HFRolloutEngine"]


class HFRolloutEngine(RolloutEngine):
    """Sample with ``policy.generate``; the policy is shared with the trainer, so no weight sync.

    Args:
        eos_token_id: id(s) that end a completion; None = the tokenizer's (filled in by :meth:`attach`).
        pad_token_id: id used to pad finished rows; None = the tokenizer's.
    """

    def __init__(self, eos_token_id: int | list[int] | None = None, pad_token_id: int | None = None) -> None:
        self.eos_token_id = eos_token_id
        self.pad_token_id = pad_token_id

    def attach(
        self, model_name_or_path: str, eos_token_id: int | list[int] | None, pad_token_id: int, seed: int
    ) -> bool:
        """Take the tokenizer's EOS / pad ids where none were given; nothing to start."""
        self.eos_token_id = eos_token_id if self.eos_token_id is None else self.eos_token_id
        self.pad_token_id = pad_token_id if self.pad_token_id is None else self.pad_token_id
        return False

    @torch.no_grad()
    def generate(
        self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig
    ) -> RolloutBatch:
        was_training = policy.training
        policy.eval()
        try:
            output = policy.generate(
                input_ids=input_ids,
                attention_mask=attention_mask,
                do_sample=True,
                temperature=sampling.temperature,
                top_p=sampling.top_p,
                top_k=sampling.top_k,
                max_new_tokens=sampling.max_new_tokens,
                num_return_sequences=sampling.num_samples,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                use_cache=True,
            )
        finally:
            policy.train(was_training)
        prompt_length = input_ids.shape[1]
        responses = output[:, prompt_length:]
        response_mask = response_mask_from_ids(responses, self.eos_token_id)
        prompt_mask = attention_mask.repeat_interleave(sampling.num_samples, dim=0)
        full_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        return RolloutBatch(sequences=output, attention_mask=full_mask, response_mask=response_mask)

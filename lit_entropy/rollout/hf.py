"""Rollouts with Hugging Face ``generate`` on the training policy itself (KV cache, left padding)."""

from __future__ import annotations

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from lit_entropy.functional.sampling import CategoricalSampler
from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids

__all__ = ["HFRolloutEngine", "SampledOneHot", "sampling_processors"]


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
        # HF fills every generation setting left unset from the checkpoint's generation_config.json (Qwen2.5's
        # sets repetition_penalty=1.05, top_k=20, top_p=0.8): samples would then come from another distribution
        # than the softmax(logits / T) the trainer's log-probs assume. A clean config for the call excludes them.
        prompt_mask = attention_mask.repeat_interleave(sampling.num_samples, dim=0)
        saved = getattr(policy, "generation_config", None)
        policy.generation_config = GenerationConfig(bos_token_id=getattr(saved, "bos_token_id", None))
        try:
            # Greedy decoding over scores that the last processor has made one-hot at a sampled token: exact
            # sampling at ~5x less CPU than HF's softmax + torch.multinomial (see lit_entropy.functional.sampling).
            output = policy.generate(
                input_ids=input_ids.repeat_interleave(sampling.num_samples, dim=0),
                attention_mask=prompt_mask,
                do_sample=False,
                logits_processor=sampling_processors(sampling),
                max_new_tokens=sampling.max_new_tokens,
                eos_token_id=self.eos_token_id,
                pad_token_id=self.pad_token_id,
                use_cache=True,
            )
        finally:
            policy.generation_config = saved
            policy.train(was_training)
        prompt_length = input_ids.shape[1]
        responses = output[:, prompt_length:]
        response_mask = response_mask_from_ids(responses, self.eos_token_id)
        full_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        return RolloutBatch(sequences=output, attention_mask=full_mask, response_mask=response_mask)


class SampledOneHot(LogitsProcessor):
    """Last logits processor of a greedy ``generate``: draws the next token from ``softmax(scores)`` and returns
    scores that are 0 there and ``-inf`` elsewhere, so the argmax is the sample."""

    def __init__(self) -> None:
        self.sampler = CategoricalSampler()

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        ids = self.sampler(scores)
        return scores.fill_(float("-inf")).scatter_(1, ids.unsqueeze(1), 0.0)


def sampling_processors(sampling: SamplingConfig) -> LogitsProcessorList:
    """HF's sampling warpers in HF's order (temperature, top-k, top-p), then the sampler :class:`SampledOneHot`."""
    processors: list[LogitsProcessor] = []
    if sampling.temperature != 1.0:
        processors.append(TemperatureLogitsWarper(sampling.temperature))
    if sampling.top_k > 0:
        processors.append(TopKLogitsWarper(sampling.top_k))
    if sampling.top_p < 1.0:
        processors.append(TopPLogitsWarper(sampling.top_p))
    return LogitsProcessorList([*processors, SampledOneHot()])

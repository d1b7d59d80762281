"""Rollouts with Hugging Face ``generate`` on the training policy itself (KV cache, left padding)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, GenerationMixin, LogitsProcessor, LogitsProcessorList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

from lit_entropy.functional.sampling import CategoricalSampler
from lit_entropy.rollout.base import RolloutBatch, RolloutEngine, SamplingConfig, response_mask_from_ids

__all__ = ["HFRolloutEngine", "SampledOneHot", "sampling_processors", "tall_lm_head"]

#: Rows (decode batch) up to which :func:`tall_lm_head` computes the CPU LM head as ``W @ h.T``. Measured, float32
#: 256 -> 151,936, 2 threads: 8 rows 62 -> 21 ms, 32 rows 88 -> 61 ms (transposed copy included), 64 rows
#: 156 -> 140 ms; at 256 rows the usual ``h @ W.T`` is faster (435 vs 522 ms).
TALL_HEAD_MAX_ROWS = 64


class HFRolloutEngine(RolloutEngine):
    """Sample with ``policy.generate``; the policy is shared with the trainer, so no weight sync.

    Log-probs: ``rollout_logprobs`` are those of the sampled token under the distribution it was drawn from,
    computed from the very scores the sampler read: ``softmax(logits / T)`` restricted to the top-k / top-p kept
    set and renormalised over it. The trainer's log-probs are of the full ``softmax(logits / T)``, so with top-p
    or top-k on, ``trainer - rollout`` sits below 0 by ``log`` of the kept mass (the correction weights below 1);
    ``model.loss.rollout_correction.kept_set_logprobs`` renormalises the trainer's side over the same kept set.

    Args:
        eos_token_id: id(s) that end a completion; None = the tokenizer's (filled in by :meth:`attach`).
        pad_token_id: id used to pad finished rows; None = the tokenizer's.
    """

    reports_logprobs = True

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
        if not isinstance(policy, GenerationMixin):
            raise TypeError(
                f"HFRolloutEngine samples with Hugging Face generate, which {type(policy).__name__} does not have "
                "(a transformers GenerationMixin model, e.g. AutoModelForCausalLM)"
            )
        was_training = policy.training
        policy.eval()
        # HF fills every generation setting left unset from the checkpoint's generation_config.json (Qwen2.5's
        # sets repetition_penalty=1.05, top_k=20, top_p=0.8): samples would then come from another distribution
        # than the softmax(logits / T) the trainer's log-probs assume. A clean config for the call excludes them.
        prompt_mask = attention_mask.repeat_interleave(sampling.num_samples, dim=0)
        greedy = sampling.temperature == 0  # evaluation only: argmax decoding, no sampler, no log-probs
        processors = LogitsProcessorList() if greedy else sampling_processors(sampling)
        sampler = None if greedy else processors[-1]
        saved = policy.generation_config  # every transformers model that can generate has one
        policy.generation_config = GenerationConfig(bos_token_id=saved.bos_token_id)
        try:
            # Greedy decoding over scores that the last processor has made one-hot at a sampled token: exact
            # sampling at ~5x less CPU than HF's softmax + torch.multinomial (see lit_entropy.functional.sampling).
            with tall_lm_head(policy):
                output = policy.generate(
                    input_ids=input_ids.repeat_interleave(sampling.num_samples, dim=0),
                    attention_mask=prompt_mask,
                    do_sample=False,
                    logits_processor=processors,
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
        logprobs = None
        if sampler is not None:
            logprobs = sampler.logprobs(responses.shape).to(responses.device).masked_fill(~response_mask, 0.0)
        full_mask = torch.cat([prompt_mask, response_mask.to(prompt_mask.dtype)], dim=1)
        return RolloutBatch(
            sequences=output, attention_mask=full_mask, response_mask=response_mask, rollout_logprobs=logprobs
        )


class SampledOneHot(LogitsProcessor):
    """Last logits processor of a greedy ``generate``: draws the next token from ``softmax(scores)`` and returns
    scores that are 0 there and ``-inf`` elsewhere, so the argmax is the sample.

    It keeps each step's sampled log-probs (of ``softmax(scores)``: the warped distribution it drew from).
    """

    def __init__(self) -> None:
        self.sampler = CategoricalSampler()
        self.steps: list[Tensor] = []

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        ids, logprobs = self.sampler.sample(scores)
        self.steps.append(logprobs)
        return scores.fill_(float("-inf")).scatter_(1, ids.unsqueeze(1), 0.0)

    def logprobs(self, shape: torch.Size) -> Tensor:
        """The recorded log-probs as ``[rows, steps]`` float32 (``shape``: the responses', to check the count)."""
        out = torch.stack(self.steps, dim=1) if self.steps else torch.zeros(shape[0], 0)
        if tuple(out.shape) != tuple(shape):
            raise RuntimeError(f"recorded {tuple(out.shape)} sampled log-probs for responses of shape {tuple(shape)}")
        return out


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


@contextmanager
def tall_lm_head(policy: nn.Module) -> Iterator[None]:
    """Within the block, a float32 CPU ``nn.Linear`` LM head computes small batches as ``(W @ h.T).T``.

    A decode step multiplies a few rows by the whole ``[V, H]`` head; CPU BLAS runs that shape faster with the
    vocabulary as the long side (see :data:`TALL_HEAD_MAX_ROWS`). The result is copied to the usual contiguous
    ``[..., V]`` layout; the values are the same products summed in another order (float32 rounding). Other
    heads (bias-free or not), devices, dtypes and sharded (DTensor) weights are left untouched.
    """
    get_head = getattr(policy, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if (
        not isinstance(head, nn.Linear)
        or head.weight.device.type != "cpu"
        or head.weight.dtype != torch.float32
        or type(head.weight.data) is not Tensor  # a DTensor (FSDP2) shard: keep the sharded module's own forward
    ):
        yield
        return
    linear = head.forward

    def forward(hidden: Tensor) -> Tensor:
        rows = hidden.numel() // hidden.shape[-1]
        if rows > TALL_HEAD_MAX_ROWS or hidden.dtype != torch.float32:
            return linear(hidden)
        flat = hidden.reshape(rows, hidden.shape[-1])
        tall = torch.mm(head.weight, flat.T)  # [V, rows]
        if head.bias is not None:
            tall += head.bias.unsqueeze(1)
        return tall.T.contiguous().view(*hidden.shape[:-1], -1)

    # An instance attribute shadows nn.Linear.forward for the block (nn.Module.__call__ calls self.forward), and
    # deleting it brings the class's method back.
    head.__dict__["forward"] = forward
    try:
        yield
    finally:
        del head.__dict__["forward"]

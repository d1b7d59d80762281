"""The rollout-engine interface: sample completions for a batch of left-padded prompts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
from torch import Tensor, nn

__all__ = ["RolloutBatch", "RolloutEngine", "SamplingConfig", "response_mask_from_ids"]


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions.

    Attributes:
        num_samples: completions per prompt; they come out as consecutive rows (a GRPO group).
        temperature: softmax temperature (> 0).
        top_p: nucleus-sampling mass in (0, 1].
        top_k: keep the k most likely tokens; 0 disables.
        max_new_tokens: completion length limit in tokens.
    """

    num_samples: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 16


@dataclass
class RolloutBatch:
    """Prompts with their sampled completions; rows are grouped by prompt (``num_samples`` each).

    Attributes:
        sequences: ``[N, P + T]`` prompt ids (left-padded to ``P``) followed by response ids.
        attention_mask: ``[N, P + T]`` 1 on real prompt and response tokens.
        response_mask: ``[N, T]`` bool, True on response tokens up to and including the first EOS.
        rollout_logprobs: ``[N, T]`` log-probs the engine sampled with, or None if it does not report them.
    """

    sequences: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor | None = None

    @property
    def prompt_length(self) -> int:
        return self.sequences.shape[1] - self.response_mask.shape[1]

    @property
    def responses(self) -> Tensor:
        """``[N, T]`` response token ids (padding after EOS)."""
        return self.sequences[:, self.prompt_length :]

    @property
    def position_ids(self) -> Tensor:
        """Positions that skip left padding, as generation used them."""
        return (self.attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def response_mask_from_ids(responses: Tensor, eos_token_id: int | list[int] | None) -> Tensor:
    """True on tokens up to and including the first EOS of each row (all tokens when there is none).

    Args:
        responses: ``[N, T]`` generated ids.
        eos_token_id: one id or a list of ids that end a completion.
    """
    if eos_token_id is None:
        return torch.ones_like(responses, dtype=torch.bool)
    eos_ids = torch.as_tensor(eos_token_id, device=responses.device).reshape(-1)
    is_eos = torch.isin(responses, eos_ids)
    # Tokens strictly after the first EOS are padding: count EOS seen before each position.
    seen_before = is_eos.long().cumsum(-1) - is_eos.long()
    return seen_before == 0


class RolloutEngine(ABC):
    """Samples completions from the current policy."""

    @abstractmethod
    def generate(
        self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig
    ) -> RolloutBatch:
        """Sample ``sampling.num_samples`` completions for each left-padded prompt row."""

    def sync_weights(self, policy: nn.Module, step: int) -> None:  # noqa: B027 - optional hook
        """Push the policy's weights after optimizer step ``step`` (no-op for engines that use the policy itself)."""

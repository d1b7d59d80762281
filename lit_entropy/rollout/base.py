"""The rollout-engine interface: sample completions for a batch of left-padded prompts."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from lit_entropy.functional.checks import check_number
from lit_entropy.rollout.trajectories import Trajectories

__all__ = [
    "MAX_TEMPERATURE",
    "MIN_TEMPERATURE",
    "RolloutBatch",
    "RolloutEngine",
    "SamplingConfig",
    "response_mask_from_ids",
]

#: The temperature range both engines sample exactly: vLLM refuses above 2 and raises anything in (0, 0.01) to 0.01.
MIN_TEMPERATURE, MAX_TEMPERATURE = 0.01, 2.0


@dataclass(frozen=True)
class SamplingConfig:
    """How to sample completions (``model.sampling`` for training rollouts)."""

    _setting_prefix: ClassVar[str] = "model.sampling."
    _greedy_allowed: ClassVar[bool] = False  # temperature 0 (greedy, one sample): evaluation only
    num_samples: int = 8
    """Completions per prompt, consecutive rows of the batch: the GRPO group size."""
    temperature: float = 1.0
    """Softmax temperature in [0.01, 2] (the range both engines honour); training log-probs use the same one."""
    top_p: float = 1.0
    """Nucleus-sampling mass in (0, 1]."""
    top_k: int = 0
    """Keep the k most likely tokens; 0 disables."""
    max_new_tokens: int = 16
    """Completion length limit in tokens."""

    def __post_init__(self) -> None:
        prefix = self._setting_prefix
        check_number(f"{prefix}num_samples", self.num_samples, low=1, integer=True)
        if self.temperature == 0 and self._greedy_allowed:
            if self.num_samples != 1:
                raise ValueError(
                    f"{prefix}temperature=0 (greedy) needs {prefix}num_samples=1, got {self.num_samples}: greedy "
                    "samples are all the same (and vLLM refuses more than one)"
                )
        else:
            check_number(f"{prefix}temperature", self.temperature, low=MIN_TEMPERATURE, high=MAX_TEMPERATURE)
        check_number(f"{prefix}top_p", self.top_p, low=0, high=1, low_open=True)
        check_number(f"{prefix}top_k", self.top_k, low=0, integer=True)
        # None only where a subclass documents a fallback (evaluation: the training limit).
        optional = self.__dataclass_fields__["max_new_tokens"].default is None
        check_number(f"{prefix}max_new_tokens", self.max_new_tokens, low=1, integer=True, optional=optional)


@dataclass
class RolloutBatch:
    """Prompts with their sampled completions; rows are grouped by prompt (``num_samples`` each).

    Attributes:
        sequences: ``[N, P + T]`` prompt ids (left-padded to ``P``) followed by response ids.
        attention_mask: ``[N, P + T]`` 1 on real prompt and response tokens.
        response_mask: ``[N, T]`` bool, True on response tokens up to and including the first EOS.
        rollout_logprobs: ``[N, T]`` log-probs the engine sampled with, or None if it does not report them.
        environment_mask: multi-turn only: ``[N, T]`` bool, True on environment tokens (tool results, observations,
            the chat template's turn markers), which the response mask leaves out: they are context, never trained
            on. The response columns a row uses are then its response and environment tokens (attention 1).
        trajectories: multi-turn only: each row's turns, tool calls, stop reason, conversation, environment.
    """

    sequences: Tensor
    attention_mask: Tensor
    response_mask: Tensor
    rollout_logprobs: Tensor | None = None
    environment_mask: Tensor | None = None
    trajectories: Trajectories | None = None

    def select(self, index: Tensor | slice) -> RolloutBatch:
        """The rows ``index`` (a slice keeps views, an index tensor copies)."""
        logprobs = None if self.rollout_logprobs is None else self.rollout_logprobs[index]
        environment = None if self.environment_mask is None else self.environment_mask[index]
        return RolloutBatch(
            sequences=self.sequences[index],
            attention_mask=self.attention_mask[index],
            response_mask=self.response_mask[index],
            rollout_logprobs=logprobs,
            environment_mask=environment,
            trajectories=None if self.trajectories is None else self.trajectories.select(index),
        )

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
    """Samples completions from the current policy.

    A config gives an engine by ``class_path`` (``model.rollout``); the module calls :meth:`attach` at setup
    with what the engine takes from the policy, and :meth:`close` at teardown if ``attach`` started it.

    Attributes:
        reports_logprobs: :meth:`generate` fills ``rollout_logprobs`` (the mismatch metrics and
            ``model.loss.rollout_correction`` need them).
    """

    reports_logprobs: ClassVar[bool] = False

    def attach(
        self, model_name_or_path: str, eos_token_id: int | list[int] | None, pad_token_id: int, seed: int
    ) -> bool:
        """Fill in what the engine was not given (model, token ids, seed) and start it if needed.

        Returns:
            True when this call started the engine, so the caller owns closing it.
        """
        return False

    def close(self) -> None:  # noqa: B027 - optional hook
        """Release the engine's resources (no-op for engines without any)."""

    @abstractmethod
    def generate(
        self, policy: nn.Module, input_ids: Tensor, attention_mask: Tensor, sampling: SamplingConfig
    ) -> RolloutBatch:
        """Sample ``sampling.num_samples`` completions for each left-padded prompt row."""

    def sync_weights(self, policy: nn.Module, step: int) -> None:  # noqa: B027 - optional hook
        """Push the policy's weights after optimizer step ``step`` (no-op for engines that use the policy itself)."""

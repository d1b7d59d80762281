"""A scored rollout batch with everything the update epochs need (Lightning-free)."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import torch
from torch import Tensor

from lit_entropy.functional.advantages import gae_advantages, grpo_advantages, whiten
from lit_entropy.protocol import TokenMaskContext
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import AdvantageConfig, PPOConfig, RFTSettings
from lit_entropy.step.forward import ResponseForward

__all__ = [
    "Experience",
    "RolloutStatistics",
    "build_experience",
    "gae_token_advantages",
    "group_token_advantages",
    "truncated_is_weights",
]


@dataclass
class RolloutStatistics:
    """What the statistics pass over a rollout batch computed, all ``[N, T]`` (detached unless ``update_forward``).

    Attributes:
        old_logprobs: log-probs of the sampled tokens under the rollout policy.
        entropy: entropy in nats at each position.
        discriminator: ``S`` of the sampled token.
        policy_average: ``E_p[S]`` when asked for, else None.
        ref_logprobs: reference log-probs (KL term), else None.
        values: critic values (PPO), else None.
        update_forward: the policy forward with its graph, when it doubles as the only update's forward.
    """

    old_logprobs: Tensor
    entropy: Tensor
    discriminator: Tensor
    policy_average: Tensor | None = None
    ref_logprobs: Tensor | None = None
    values: Tensor | None = None
    update_forward: ResponseForward | None = None

    @staticmethod
    def cat(parts: list[RolloutStatistics]) -> RolloutStatistics:
        """Concatenate per-micro-batch statistics along the rows (the last part's ``update_forward`` is kept:
        a reused forward exists only when there is a single part)."""
        tensors = {
            f.name: None if getattr(parts[0], f.name) is None else torch.cat([getattr(p, f.name) for p in parts])
            for f in fields(RolloutStatistics)
            if f.name != "update_forward"
        }
        return RolloutStatistics(**tensors, update_forward=parts[-1].update_forward)


@dataclass
class Experience:
    """One rollout batch after scoring and the no-grad statistics pass; rows grouped by prompt.

    Per-token tensors are ``[N, T]`` (``N`` = prompts x samples, ``T`` = response length).

    Attributes:
        rollout: the sampled batch.
        rewards: ``[N]`` one reward per completion.
        advantages: ``[N, T]`` float32.
        old_logprobs: log-probs of the sampled tokens under the rollout policy.
        entropy: entropy (nats) at each position.
        discriminator: ``S = p (H + log p)`` of the sampled token.
        policy_average: ``E_p[S]``, when a callback asked for it.
        ref_logprobs: reference-model log-probs (KL term), else None.
        old_values: critic values at rollout time (PPO), else None.
        returns: GAE returns (PPO), else None.
        loss_mask: bool, the response mask AND every callback's keep mask.
        penalty: per-token coefficients of ``|log p - log p_old|`` from penalty providers, or None.
        rollout_gap: trainer minus rollout-engine log-prob of each sampled token, when the engine reports them.
        update_forward: the update's own forward (with its graph) when it doubles as the statistics pass.
        coefficients: loss coefficients for this batch (``entropy_coef``: the setting or a callback's value).
    """

    rollout: RolloutBatch
    rewards: Tensor
    advantages: Tensor
    old_logprobs: Tensor
    entropy: Tensor
    discriminator: Tensor
    policy_average: Tensor | None = None
    ref_logprobs: Tensor | None = None
    old_values: Tensor | None = None
    returns: Tensor | None = None
    loss_mask: Tensor | None = None
    penalty: Tensor | None = None
    rollout_gap: Tensor | None = None
    update_forward: ResponseForward | None = None
    coefficients: dict[str, float] = field(default_factory=dict)

    @property
    def response_mask(self) -> Tensor:
        return self.rollout.response_mask

    def token_context(self) -> TokenMaskContext:
        """The :class:`~lit_entropy.protocol.TokenMaskContext` that callbacks read for this batch."""
        return TokenMaskContext(
            mask=self.response_mask,
            advantages=self.advantages,
            discriminator=self.discriminator,
            policy_average=self.policy_average,
            entropy=self.entropy,
            old_logprobs=self.old_logprobs,
        )

    def rows(self, index: Tensor) -> Experience:
        """The selected rows (the reused statistics forward, which covers all rows, is dropped)."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        rollout = self.rollout.select(index)
        tensors = {
            name: pick(getattr(self, name))
            for name in (
                "rewards advantages old_logprobs entropy discriminator policy_average ref_logprobs old_values "
                "returns loss_mask penalty rollout_gap"
            ).split()
        }
        return replace(self, rollout=rollout, update_forward=None, **tensors)


def group_token_advantages(rewards: Tensor, group_size: int, response_len: int, config: AdvantageConfig) -> Tensor:
    """GRPO: group-relative advantages ``[N]`` broadcast over the ``T`` response tokens, ``[N, T]`` float32."""
    advantages = grpo_advantages(rewards, group_size, scale=config.scale)
    return advantages.unsqueeze(-1).expand(-1, response_len).float().contiguous()


def gae_token_advantages(rewards: Tensor, values: Tensor, mask: Tensor, config: PPOConfig) -> tuple[Tensor, Tensor]:
    """PPO: GAE advantages and returns ``[N, T]``; the sequence reward arrives with the last response token."""
    last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
    token_rewards = torch.where(last, rewards.unsqueeze(-1), torch.zeros_like(values))
    advantages, returns = gae_advantages(token_rewards, values, mask, gamma=config.gamma, lam=config.lam)
    if config.whiten_advantages:
        advantages = whiten(advantages, mask)
    return advantages.float(), returns


def truncated_is_weights(gap: Tensor, threshold: float) -> Tensor:
    """Truncated importance weights ``min(exp(logp_trainer - logp_rollout), threshold)`` per token.

    The surrogate is linear in the advantage, so weighting A weights each token's loss.
    """
    return gap.exp().clamp(max=threshold)


def build_experience(
    rollout: RolloutBatch, rewards: Tensor, statistics: RolloutStatistics, settings: RFTSettings
) -> Experience:
    """Advantages (GRPO groups or PPO GAE, optionally truncated-IS weighted) on top of the statistics pass.

    The loss mask starts as the response mask; callbacks narrow it afterwards.
    """
    mask = rollout.response_mask
    returns = None
    if settings.ppo is None:
        advantages = group_token_advantages(rewards, settings.sampling.num_samples, mask.shape[1], settings.advantages)
    else:
        advantages, returns = gae_token_advantages(rewards, statistics.values, mask, settings.ppo)
    gap = None
    if rollout.rollout_logprobs is not None:
        # The trainer's and the engine's log-probs of the same tokens differ (kernels, precision).
        gap = (statistics.old_logprobs - rollout.rollout_logprobs).masked_fill(~mask, 0.0)
        if settings.advantages.rollout_is_threshold is not None:
            advantages = advantages * truncated_is_weights(gap, settings.advantages.rollout_is_threshold)
    return Experience(
        rollout=rollout,
        rewards=rewards,
        advantages=advantages,
        old_logprobs=statistics.old_logprobs,
        entropy=statistics.entropy,
        discriminator=statistics.discriminator,
        policy_average=statistics.policy_average,
        ref_logprobs=statistics.ref_logprobs,
        old_values=statistics.values,
        returns=returns,
        loss_mask=mask,
        rollout_gap=gap,
        update_forward=statistics.update_forward,
    )

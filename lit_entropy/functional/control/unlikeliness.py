"""The unlikeliness reward (arXiv 2506.02355, "Rewarding the Unlikely").

Source: the authors' code, GitHub AndreHe02/rewarding-unlikely-release, ``verl/trainer/ppo/ray_lean_trainer.py``
(``RayLeanTrainer._compute_advantages``, option ``lean.rank_penalty``). Restated: within each group of ``G``
samples of a prompt, rank the samples by their mean token log-prob under the rollout policy (rank 0 = the
least likely), scale each reward by ``1 - beta rank / G``, then normalise as GRPO with the scaled rewards:
``(r' - mean r') / (std r' + 1e-6)`` (``std`` unbiased; a group of one gets mean 0, std 1). With 0/1 rewards
only correct samples change: the likelier a correct proof, the smaller its reward. The paper's beta is 0.25.

Ties in the mean log-prob keep row order (a stable sort; the authors' unstable ``argsort`` leaves them
unspecified). A row without valid tokens has no mean (the authors' masked mean gives NaN, which their argsort
ranks last): here it ranks as the likeliest of its group, the same place.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_number

__all__ = ["check_unlikeliness_args", "sequence_mean_logprobs", "unlikeliness_advantages", "unlikeliness_rewards"]

GRPO_EPS = 1e-6


def check_unlikeliness_args(beta: float, group_size: int | None = None) -> None:
    """Raise a ValueError naming the first bad argument, its value and what is allowed."""
    check_number("beta", beta, low=0, high=1)
    if group_size is not None:
        check_number("group_size", group_size, low=1, integer=True)


def sequence_mean_logprobs(logprobs: Tensor, mask: Tensor) -> Tensor:
    """Mean log-prob ``[B]`` (float64) of each row's valid tokens; ``+inf`` for a row without any."""
    values = torch.where(mask, logprobs.detach().to(torch.float64), 0.0)
    counts = mask.sum(-1)
    mean = values.sum(-1) / counts.clamp(min=1)
    return mean.masked_fill(counts == 0, float("inf"))


def unlikeliness_rewards(rewards: Tensor, mean_logprobs: Tensor, *, group_size: int, beta: float = 0.25) -> Tensor:
    """``r (1 - beta rank / G)`` per row ``[B]`` (float64), ``rank`` the row's place by ``mean_logprobs`` in its group.

    Args:
        rewards: ``[B]``, rows in consecutive groups of ``group_size``.
        mean_logprobs: ``[B]`` from :func:`sequence_mean_logprobs`.
        group_size: ``G``.
        beta: the rank penalty, in [0, 1].
    """
    check_unlikeliness_args(beta, group_size)
    if rewards.shape[0] % group_size:
        raise ValueError(f"{rewards.shape[0]} rows do not split into groups of group_size={group_size}")
    grouped = mean_logprobs.to(torch.float64).reshape(-1, group_size)
    order = torch.argsort(grouped, dim=-1, stable=True)
    ranks = torch.argsort(order, dim=-1, stable=True).to(torch.float64)
    return rewards.to(torch.float64) * (1.0 - beta * ranks.reshape(-1) / group_size)


def unlikeliness_advantages(
    rewards: Tensor, logprobs: Tensor, mask: Tensor, *, group_size: int, beta: float = 0.25
) -> Tensor:
    """GRPO advantages ``[B, T]`` (float64, 0 outside ``mask``) of the unlikeliness-scaled rewards.

    Args:
        rewards: ``[B]`` one reward per sequence, rows in consecutive groups of ``group_size``.
        logprobs: ``[B, T]`` rollout log-probs of the sampled tokens.
        mask: ``[B, T]`` bool, valid tokens.
        group_size: samples per prompt.
        beta: the rank penalty.
    """
    scaled = unlikeliness_rewards(rewards, sequence_mean_logprobs(logprobs, mask), group_size=group_size, beta=beta)
    grouped = scaled.reshape(-1, group_size)
    if group_size == 1:
        mean, std = torch.zeros_like(grouped), torch.ones_like(grouped)
    else:
        mean, std = grouped.mean(-1, keepdim=True), grouped.std(-1, keepdim=True)
    advantages = ((grouped - mean) / (std + GRPO_EPS)).reshape(-1)
    return advantages.unsqueeze(-1).expand(mask.shape).masked_fill(~mask, 0.0)

"""What a training step shows in TensorBoard besides scalars: sample completions and the entropy histogram."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lit_entropy.functional.masked import masked_mean
from lit_entropy.metrics import ClipRatio, TokenEntropy

__all__ = ["TrainStepMetrics", "log_samples", "samples_markdown", "step_scalars"]


class TrainStepMetrics(nn.Module):
    """Global (all-rank) token entropy and PPO clip fractions of one training step.

    Args:
        clip_ratio_low: lower PPO clip epsilon.
        clip_ratio_high: upper PPO clip epsilon.
    """

    def __init__(self, clip_ratio_low: float, clip_ratio_high: float) -> None:
        super().__init__()
        self.entropy = TokenEntropy()
        self.clip = ClipRatio(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)

    def compute_and_reset(self) -> dict[str, Tensor]:
        """``train/entropy`` and ``train/clip_ratio`` (``_low``, ``_high``) of the step; resets for the next one."""
        clip = self.clip.compute()
        out = {
            "train/entropy": self.entropy.compute(),
            "train/clip_ratio": clip["total"],
            "train/clip_ratio_low": clip["low"],
            "train/clip_ratio_high": clip["high"],
        }
        self.entropy.reset()
        self.clip.reset()
        return out


def step_scalars(experience: Any, group_size: int) -> dict[str, Tensor]:
    """Per-step scalars of one scored rollout batch (an :class:`~lit_entropy.step.Experience`)."""
    mask, rewards = experience.response_mask, experience.rewards
    logs = {
        "train/reward_mean": rewards.mean(),
        "train/reward_std": rewards.std() if rewards.numel() > 1 else rewards.new_zeros(()),
        "train/frac_reward_zero_std": (rewards.view(-1, group_size).std(-1) == 0).float().mean(),
        "train/response_length": mask.sum(-1).float().mean(),
        "train/loss_token_frac": experience.loss_mask.sum() / mask.sum().clamp(min=1),
    }
    if experience.rollout_gap is not None:
        gap = experience.rollout_gap.abs()
        logs["train/rollout_logprob_gap_mean"] = masked_mean(gap, mask)
        logs["train/rollout_logprob_gap_max"] = gap.max()
    return {k: torch.as_tensor(v) for k, v in logs.items()}


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:300]


def samples_markdown(
    prompts: list[str], answers: list[str], completions: list[str], rewards: Tensor, group_size: int, num_prompts: int
) -> str:
    """The first completion of the first ``num_prompts`` prompts, as a Markdown table.

    Args:
        prompts: one per prompt.
        answers: one per prompt.
        completions: ``group_size`` consecutive completions per prompt.
        rewards: ``[len(completions)]``.
        group_size: completions per prompt.
        num_prompts: how many prompts to show.
    """
    lines = ["| prompt | completion | answer | reward |", "|---|---|---|---|"]
    for prompt_idx in range(min(num_prompts, len(prompts))):
        row = prompt_idx * group_size
        lines.append(
            f"| {_cell(prompts[prompt_idx])} | {_cell(completions[row])} | "
            f"{_cell(answers[prompt_idx])} | {float(rewards[row]):.2f} |"
        )
    return "\n".join(lines)


def log_samples(
    writer: Any, step: int, experience: Any, batch: dict[str, Any], completions: list[str], num_prompts: int
) -> None:
    """Write the token-entropy histogram and a samples table of one rollout batch to a TensorBoard ``writer``."""
    mask = experience.response_mask
    group = len(completions) // len(batch["prompts"])
    writer.add_histogram("train/token_entropy", experience.entropy[mask].float().cpu(), step)
    table = samples_markdown(batch["prompts"], batch["answers"], completions, experience.rewards, group, num_prompts)
    writer.add_text("train/samples", table, step)

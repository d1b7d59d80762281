"""Validation / test metrics of sampled completions: Avg@K and the Pass@k ladder (DDP-correct torchmetrics)."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from lit_entropy.metrics import AvgAtK, PassAtK

__all__ = ["SampleEvaluator"]


class SampleEvaluator(nn.Module):
    """Avg@K and Pass@k over prompts with K samples each.

    Args:
        pass_ks: the k of ``pass@k`` (each <= K).
        correct_threshold: a sample counts as correct when its reward is >= this.
    """

    def __init__(self, pass_ks: list[int], correct_threshold: float = 1.0) -> None:
        super().__init__()
        self.correct_threshold = correct_threshold
        self.reward_range: tuple[float, float] | None = None  # (min, max) seen this epoch
        self.warned = False
        self.avg = AvgAtK()
        self.passes = nn.ModuleDict({str(k): PassAtK(k) for k in pass_ks})

    def reset(self) -> None:
        # Lightning resets logged metrics inside its evaluation context, which may be inference
        # mode; states created there could not be updated by a later no-grad validation pass.
        with torch.inference_mode(False):
            for metric in (self.avg, *self.passes.values()):
                metric.reset()
        self.reward_range = None

    def update_and_log(self, module: Any, prefix: str, rewards: Tensor, rollout: Any, k: int) -> None:
        """Add one batch (``rewards`` ``[prompts * K]``, prompt groups) and log it through ``module``.

        Logs ``<prefix>/avg@K``, ``<prefix>/pass@k`` (DDP-correct metrics), ``<prefix>/reward_mean`` and
        ``<prefix>/response_length``. A sample is correct when its reward is >= ``correct_threshold``.
        """
        low, high = float(rewards.min()), float(rewards.max())
        seen = self.reward_range or (low, high)
        self.reward_range = (min(seen[0], low), max(seen[1], high))
        correct = (rewards >= self.correct_threshold).view(-1, k)
        self.avg.update(correct)
        for metric in self.passes.values():
            metric.update(correct)
        size = correct.shape[0]
        module.log(f"{prefix}/avg@{k}", self.avg, on_epoch=True, prog_bar=True, batch_size=size)
        for kk, metric in self.passes.items():
            module.log(f"{prefix}/pass@{kk}", metric, on_epoch=True, batch_size=size)
        module.log(f"{prefix}/reward_mean", rewards.mean(), on_epoch=True, batch_size=size, sync_dist=True)
        lengths = rollout.response_mask.sum(-1).float().mean()
        module.log(f"{prefix}/response_length", lengths, on_epoch=True, batch_size=size, sync_dist=True)

    def check_threshold(self) -> None:
        """Warn once when no reward of the finished epoch reached ``correct_threshold`` (Avg@K and Pass@k are then 0
        by construction: the threshold may not suit the reward's scale)."""
        if self.warned or self.reward_range is None or self.reward_range[1] >= self.correct_threshold:
            return
        self.warned = True
        low, high = self.reward_range
        rank_zero_warn(
            f"lit_entropy: no validation reward reached model.reward.correct_threshold={self.correct_threshold} "
            f"(observed rewards in [{low:g}, {high:g}]): every sample counts as incorrect for avg@K / pass@k; set "
            "model.reward.correct_threshold to the reward that means a correct answer"
        )

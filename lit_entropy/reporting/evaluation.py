"""Validation / test metrics of sampled completions: Avg@K, the Pass@k ladder and a per-class Avg@K breakdown.

Duplicates are logged once: ``pass@1`` equals ``avg@K`` by construction (the unbiased pass@1 estimator is the
share of correct samples), so the ladder starts at k = 2; the reward mean is logged only when some reward is
not 0 or 1 (for 0/1 rewards with ``correct_threshold`` 1 it equals ``avg@K``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn
from torchmetrics import MeanMetric, SumMetric

from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.metrics import AvgAtK, PassAtK

__all__ = ["SampleEvaluator", "dataset_classes", "evaluation_tags"]


def evaluation_tags(prefix: str, k: int, pass_ks: list[int]) -> list[str]:
    """The headline tags of one evaluation: ``<prefix>/avg@K`` and ``<prefix>/pass@k`` for each k > 1."""
    return [f"{prefix}/avg@{k}", *(f"{prefix}/pass@{kk}" for kk in pass_ks if kk > 1)]


def dataset_classes(trainer: Any) -> list[str] | None:
    """The sorted class names of the evaluation data (``PromptDataModule(class_key=...)``), else None."""
    data = getattr(trainer, "datamodule", None) if trainer is not None else None
    names = getattr(data, "val_classes", None)
    return names() if callable(names) else None


class SampleEvaluator(nn.Module):
    """Avg@K and Pass@k over prompts with K samples each, plus Avg@K per class of prompt.

    Args:
        pass_ks: the k of ``pass@k`` (each <= K); k = 1 is not logged (it equals Avg@K).
        correct_threshold: a sample counts as correct when its reward is >= this.
    """

    def __init__(self, pass_ks: list[int], correct_threshold: float = 1.0) -> None:
        super().__init__()
        self.correct_threshold = correct_threshold
        self.reward_range: tuple[float, float] | None = None  # (min, max) seen this epoch
        self.warned = False
        self.avg = AvgAtK()
        self.passes = nn.ModuleDict({str(k): PassAtK(k) for k in pass_ks})
        self.reward = MeanMetric()
        self.non_binary = SumMetric()  # rewards seen this epoch that are neither 0 nor 1
        self.classes: list[str] = []
        self.class_sums = torch.zeros(0, 2, dtype=torch.float64)  # per class: sum of per-prompt avg, prompts
        self.k: int | None = None

    def _pass_metrics(self) -> list[PassAtK]:
        """The ``pass@k`` metrics (held in a ModuleDict, so they move with the module)."""
        return [metric for metric in self.passes.values() if isinstance(metric, PassAtK)]

    def reset(self, classes: list[str] | None = None) -> None:
        """Start an epoch; ``classes``: every class name of the evaluation data (the same on every rank)."""
        # Lightning resets logged metrics inside its evaluation context, which may be inference
        # mode; states created there could not be updated by a later no-grad validation pass.
        with torch.inference_mode(False):
            for metric in (self.avg, self.reward, self.non_binary, *self._pass_metrics()):
                metric.reset()
        self.reward_range = None
        self.classes = list(classes or [])
        self.class_sums = torch.zeros(len(self.classes), 2, dtype=torch.float64)

    def update_and_log(
        self,
        log: Callable[..., Any],
        prefix: str,
        rewards: Tensor,
        rollout: Any,
        k: int,
        classes: list[str] | None = None,
    ) -> None:
        """Add one batch (``rewards`` ``[prompts * K]``, prompt groups) and log it with ``log`` (``module.log``).

        Logs ``<prefix>/avg@K``, ``<prefix>/pass@k`` for k > 1 (DDP-correct metrics) and ``<prefix>/length/mean``.
        A sample is correct when its reward is >= ``correct_threshold``. ``classes``: one per prompt, for
        the per-class breakdown :meth:`log_epoch_end` logs.
        """
        low, high = float(rewards.min()), float(rewards.max())
        seen = self.reward_range or (low, high)
        self.reward_range = (min(seen[0], low), max(seen[1], high))
        correct = (rewards >= self.correct_threshold).view(-1, k)
        self.k = k
        self.avg.update(correct)
        for metric in self._pass_metrics():
            metric.update(correct)
        self.reward.update(rewards.float())
        self.non_binary.update(((rewards != 0) & (rewards != 1)).sum().float())
        if classes is not None and self.classes:
            index = torch.tensor([self.classes.index(c) for c in classes])
            per_prompt = correct.double().mean(-1).cpu()
            self.class_sums.index_add_(0, index, torch.stack([per_prompt, torch.ones_like(per_prompt)], -1))
        size = correct.shape[0]
        log(f"{prefix}/avg@{k}", self.avg, on_epoch=True, prog_bar=True, batch_size=size)
        for kk, pass_metric in self.passes.items():
            if kk != "1":
                log(f"{prefix}/pass@{kk}", pass_metric, on_epoch=True, batch_size=size)
        lengths = rollout.response_mask.sum(-1).float().mean()
        log(f"{prefix}/length/mean", lengths, on_epoch=True, batch_size=size, sync_dist=True)

    def log_epoch_end(self, log: Callable[..., Any], prefix: str, device: torch.device) -> None:
        """Log ``<prefix>/reward/mean`` (only when some reward was neither 0 nor 1) and ``<prefix>/avg@K/<class>``.

        Every rank must call it: the decisions use globally reduced values, so all ranks log the same tags.
        ``log`` is ``LightningModule.log``; ``device``: where the all-reduce runs (this rank's device).
        """
        if self.k is None:
            return
        if float(self.non_binary.compute()) > 0:
            log(f"{prefix}/reward/mean", self.reward.compute(), on_epoch=True)
        if self.classes:
            sums = all_reduce_sum(self.class_sums.to(device)).tolist()
            for name, (total, prompts) in zip(self.classes, sums, strict=True):
                if prompts > 0:
                    log(f"{prefix}/avg@{self.k}/{name}", total / prompts, on_epoch=True)
        self.check_threshold()

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

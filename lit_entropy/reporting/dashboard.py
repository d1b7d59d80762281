"""What a training step shows in TensorBoard: :class:`TrainDashboard` logs the ``train/*`` and ``perf/*`` tags.

The tag scheme (docs/dashboard.md has the full table) groups related curves by prefix
(``train/reward/*``, ``train/length/*``, ``train/clip/*``, ``perf/*``...) and follows TRL's and verl's
names where users look for them. A tag is logged only when it can carry information in the run, which
:class:`~lit_entropy.reporting.tag_plan.TagPlan` decides once, identically on every rank. The pieces: the plan
(:mod:`~lit_entropy.reporting.tag_plan`), the global batch statistics (:mod:`~lit_entropy.reporting.batch_statistics`),
the phase timer (:mod:`~lit_entropy.reporting.timing`) and the samples table (:mod:`~lit_entropy.reporting.samples`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lit_entropy.distributed.collectives import all_reduce_max, all_reduce_sum
from lit_entropy.functional.rollout_correction import mismatch_metrics
from lit_entropy.metrics import TokenEntropy
from lit_entropy.reporting.batch_statistics import (
    batch_statistics,
    estimator_input_scalars,
    fill_scalars,
    masked_moments,
)
from lit_entropy.reporting.multi_turn import multi_turn_scalars
from lit_entropy.reporting.tag_plan import TagPlan, loss_scalars
from lit_entropy.reporting.timing import PhaseTimer, peak_memory_mb

__all__ = ["DashboardRun", "StepReport", "TrainDashboard"]


@dataclass(frozen=True)
class DashboardRun:
    """What :class:`TrainDashboard` needs to know about the run; the module builds it (the same on every rank).

    Attributes:
        plan: which optional tags are logged.
        group_size: samples per prompt (rows are grouped by prompt, ``group_size`` consecutive rows each).
        max_new_tokens: the sampling length limit (a completion this long without an EOS is truncated).
        eos_token_ids: ids that end a completion.
        device: this rank's device (peak memory is read from it).
        log: ``LightningModule.log``: ``log(name, value, **options)``.
    """

    plan: TagPlan
    group_size: int
    max_new_tokens: int
    eos_token_ids: tuple[int, ...]
    device: torch.device
    log: Callable[..., Any]


@dataclass(frozen=True)
class StepReport:
    """The finished numbers of one training step, handed by the module to :meth:`TrainDashboard.log_step`.

    Attributes:
        experience: the step's :class:`~lit_entropy.step.Experience` after the callbacks (rewards, advantages,
            entropy, masks, coefficients, rollout gap).
        terms: mean loss terms of the step's updates and ``grad_norm`` (:meth:`RFTModule.update`).
        prompts: prompts in this rank's batch.
        lr: the learning rate after the step.
        skipped_updates: updates skipped so far in the run (cumulative).
        clip: the step's clip fractions as the policy loss counts them (``LossClipFractions.compute()``: ``low``,
            ``high``, ``total``, ``dual``), or None when the plan logs none.
        fill: the dynamic-sampling :class:`~lit_entropy.step.group_fill.FillStep` that finished this update's
            fill, or None without filtering (``train/filter/*``, :func:`fill_scalars`).
    """

    experience: Any
    terms: dict[str, float]
    prompts: int
    lr: float
    skipped_updates: int = 0
    clip: dict[str, Tensor] | None = None
    fill: Any = None


class TrainDashboard(nn.Module):
    """Everything one training step logs besides the callbacks' own tags (owned by the module).

    Data flows one way: the module times its phases with :attr:`timer` and hands each step's finished
    numbers (:class:`StepReport`) to :meth:`log_step` with a :class:`DashboardRun`; the dashboard never
    reads the module.
    """

    def __init__(self) -> None:
        super().__init__()
        self.entropy = TokenEntropy()
        self.timer = PhaseTimer()
        # Rewards other than 0 / 1 seen so far: before, reward min / max are 0 / 1 and say nothing.
        self.non_binary_rewards = False

    def log_step(self, run: DashboardRun, report: StepReport) -> None:
        """Log the step's ``train/*`` and ``perf/*`` scalars with ``run.log`` (every rank calls it)."""
        plan, experience, log = run.plan, report.experience, run.log
        stats = batch_statistics(experience, run.group_size, run.max_new_tokens, list(run.eos_token_ids), plan)
        self.non_binary_rewards |= stats.pop("non_binary_rewards") > 0  # a global count: every rank agrees
        if not self.non_binary_rewards:
            del stats["train/reward/min"], stats["train/reward/max"]
        if plan.lr_changes:
            stats["train/optim/lr"] = report.lr
        if report.skipped_updates:  # a cumulative count, logged from the first skipped update on
            stats["train/optim/skipped_updates"] = float(report.skipped_updates)
        if plan.coefficient_providers:
            stats["train/loss/entropy_coef"] = experience.coefficients["entropy_coef"]
        if experience.rollout_gap is not None:
            stats.update(self._gap(experience))
        stats.update(fill_scalars(report.fill) if report.fill is not None else {})
        stats.update(multi_turn_scalars(experience.rollout) if experience.rollout.trajectories is not None else {})
        stats.update(estimator_input_scalars(getattr(experience, "estimator_inputs", {}), run.device))
        stats.update(self._perf(run, experience))
        for key, value in stats.items():
            log(key, torch.tensor(float(value)), on_step=True, batch_size=report.prompts)
        for key, value in loss_scalars(report.terms, plan).items():
            log(key, torch.tensor(float(value)), on_step=True, batch_size=report.prompts, sync_dist=True)
        self.entropy.update(experience.entropy, experience.response_mask)
        entropy = self.entropy.compute()
        log("train/entropy/mean", entropy, on_step=True, batch_size=1)
        if plan.off_policy and report.clip is not None:
            dual = (("dual", "dual"),) if plan.dual_clip else ()
            for name, key in (("ratio", "total"), ("low", "low"), ("high", "high"), *dual):
                log(f"train/clip/{name}", report.clip[key], on_step=True, batch_size=1)
        self.entropy.reset()
        log("reward", stats["train/reward/mean"], prog_bar=True, logger=False, batch_size=1)
        log("entropy", entropy, prog_bar=True, logger=False, batch_size=1)

    def _gap(self, experience: Any) -> dict[str, float]:
        """Trainer minus rollout-engine log-prob of the sampled tokens, and the mismatch metrics (KL k1 / k3,
        perplexity ratio, the correction weights' ESS and fractions above / below its bounds) of the global batch
        (engines that report log-probs)."""
        mask = experience.response_mask
        sums, extremes = masked_moments(experience.rollout_gap.abs(), mask)
        sums, extremes = all_reduce_sum(sums), all_reduce_max(extremes)
        out = {
            "train/rollout/logprob_gap_mean": float(sums[1]) / max(float(sums[0]), 1.0),
            "train/rollout/logprob_gap_max": float(extremes[0]),
        }
        if experience.mismatch is not None:
            metrics = mismatch_metrics(all_reduce_sum(experience.mismatch.clone()))
            if experience.rollout_weights is None:  # no correction: no bounds to be out of
                del metrics["frac_above"], metrics["frac_below"]
            out.update({f"train/rollout/{name}": value for name, value in metrics.items()})
        return out

    def _perf(self, run: DashboardRun, experience: Any) -> dict[str, float]:
        """``perf/time_<phase>_s`` of this rank, generated tokens per second (global), peak memory (this rank)."""
        seconds = self.timer.pop()
        if not run.plan.syncs_weights:
            seconds.pop("sync", None)
        out = {f"perf/time_{phase}_s": value for phase, value in seconds.items()}
        tokens = all_reduce_sum(experience.response_mask.sum().to(torch.float64).reshape(1))
        if "generate" in seconds:
            out["perf/tokens_per_s"] = float(tokens) / max(seconds["generate"], 1e-9)
        out["perf/peak_memory_mb"] = peak_memory_mb(run.device)
        return out

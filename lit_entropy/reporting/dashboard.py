"""What a training step shows in TensorBoard: the ``train/*`` and ``perf/*`` tags, samples and histograms.

The tag scheme (docs/dashboard.md has the full table) groups related curves by prefix
(``train/reward/*``, ``train/length/*``, ``train/clip/*``, ``perf/*``...) and follows TRL's and verl's
names where users look for them. A tag is logged only when it can carry information in the run, which
:class:`TagPlan` decides once, identically on every rank. Batch statistics are computed over the
global batch here (sums, minima and maxima reduced across ranks), so they are logged without
Lightning's ``sync_dist`` averaging, which would turn a global minimum into a mean of minima.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from lit_entropy import protocol
from lit_entropy.distributed.collectives import all_reduce_max, all_reduce_sum
from lit_entropy.functional.registry import policy_loss_attribute
from lit_entropy.functional.rollout_correction import mismatch_metrics
from lit_entropy.metrics import TokenEntropy
from lit_entropy.reporting.multi_turn import conversation_cells, multi_turn_scalars, truncated_trajectories
from lit_entropy.reporting.overview import MASKED_FRAC_TAG
from lit_entropy.rollout.base import RolloutEngine
from lit_entropy.settings import LossConfig, OptimConfig

__all__ = [
    "DashboardRun",
    "PhaseTimer",
    "StepReport",
    "TagPlan",
    "TrainDashboard",
    "batch_statistics",
    "informative_groups",
    "fill_scalars",
    "estimator_input_scalars",
    "loss_scalars",
    "module_tag_plan",
    "peak_memory_mb",
    "samples_markdown",
]

LOSS_TAGS = {
    "pg_loss": "train/loss/policy",
    "kl": "train/loss/kl",
    "entropy_bonus": "train/loss/entropy_bonus",
    "token_penalty": "train/loss/token_penalty",
    "value_loss": "train/loss/value",
}
"""Update-loss terms (:class:`~lit_entropy.step.UpdateLoss`) and their tags; each is present only when on."""


@dataclass(frozen=True)
class TagPlan:
    """Which optional ``train/*`` tags can carry information in this run (the same on every rank).

    Attributes:
        off_policy: more than one optimizer step per rollout batch: only then can the PPO ratio leave 1, so
            only then are ``train/clip/*`` and ``train/clip/approx_kl`` logged (one on-policy update has
            ratio 1 and zero clip fractions by construction).
        lr_changes: warm-up or a decaying schedule: ``train/optim/lr`` is logged.
        grouped: more than one sample per prompt: ``train/reward/frac_zero_std`` is logged.
        mask_providers: number of keep-mask callbacks: ``train/entropy/{masked,kept}`` with one or more,
            ``train/mask/loss_token_frac`` with two or more (with one it is ``1 -`` that callback's ``frac``).
        coefficient_providers: a loss-coefficient callback may change ``entropy_coef``: it is logged.
        syncs_weights: the rollout engine holds its own copy of the weights (vLLM): ``perf/time_sync_s``
            is logged (Hugging Face ``generate`` samples from the policy itself: nothing to sync).
        dual_clip: off-policy, and the policy loss applies a dual clip (``ppo`` with ``model.loss.clip_ratio_c``
            set): ``train/clip/dual`` is logged.
    """

    off_policy: bool = False
    lr_changes: bool = False
    grouped: bool = True
    mask_providers: int = 0
    coefficient_providers: bool = False
    syncs_weights: bool = False
    dual_clip: bool = False

    @staticmethod
    def decide(
        *,
        updates_per_batch: int,
        optim: OptimConfig,
        group_size: int,
        mask_providers: int,
        coefficient_providers: int,
        rollout_engine: RolloutEngine,
        loss: LossConfig | None = None,
    ) -> TagPlan:
        """The plan of a run from what it is made of (every rank must pass the same values).

        Args:
            updates_per_batch: optimizer steps per rollout batch (epochs x mini-batches).
            optim: the optimizer settings (warm-up and LR schedule).
            group_size: samples per prompt.
            mask_providers: keep-mask callbacks attached to the trainer.
            coefficient_providers: loss-coefficient callbacks attached to the trainer.
            rollout_engine: the engine that samples the rollouts.
            loss: the policy loss settings (None: no dual clip is assumed).
        """
        dual = (
            loss is not None and loss.clip_ratio_c is not None and policy_loss_attribute(loss.policy_loss, "dual_clip")
        )
        return TagPlan(
            off_policy=updates_per_batch > 1,
            lr_changes=optim.warmup_steps > 0 or optim.lr_schedule != "constant",
            grouped=group_size > 1,
            mask_providers=mask_providers,
            coefficient_providers=coefficient_providers > 0,
            syncs_weights=type(rollout_engine).sync_weights is not RolloutEngine.sync_weights,
            dual_clip=updates_per_batch > 1 and dual,
        )


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


def module_tag_plan(module: Any, trainer: Any, updates_per_batch: int) -> TagPlan:
    """The :class:`TagPlan` of an :class:`~lit_entropy.module.RFTModule`'s run: its settings and engine, the
    trainer's token callbacks, ``updates_per_batch`` optimizer steps per rollout batch."""
    settings = module.settings
    return TagPlan.decide(
        updates_per_batch=updates_per_batch, optim=settings.optim, loss=settings.loss,
        group_size=settings.sampling.num_samples, rollout_engine=module.rollout_engine,
        mask_providers=len(protocol.token_mask_providers(trainer)),
        coefficient_providers=len(protocol.loss_coefficient_providers(trainer)),
    )  # fmt: skip


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


def fill_scalars(step: Any) -> dict[str, float]:
    """``train/filter/*`` of a finished dynamic-sampling fill (``model.sampling.filter_groups``), summed over ranks:
    the generation batches it drew, the groups (prompts) generated, the informative ones among them (correctness
    not all-equal) and those the update trained on (a batch; fewer when ``max_gen_batches`` ran out; a surplus is
    dropped).

    Args:
        step: a :class:`~lit_entropy.step.group_fill.FillStep` with ``done`` True.
    """
    counts = step.counts
    return {
        "train/filter/gen_batches": float(step.fill.gen_batches),
        "train/filter/groups_drawn": float(counts.drawn),
        "train/filter/groups_kept": float(counts.kept),
        "train/filter/groups_trained": float(step.train_groups * counts.ranks),
    }


class PhaseTimer:
    """Wall-clock seconds of the named phases of one training step (``perf/time_<phase>_s``).

    CUDA work is asynchronous: on a GPU each phase ends with a synchronize so its time is its own.
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, phase: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            self.seconds[phase] = self.seconds.get(phase, 0.0) + time.perf_counter() - start

    def pop(self) -> dict[str, float]:
        """The phases timed since the last ``pop``, and reset."""
        out, self.seconds = self.seconds, {}
        return out


def peak_memory_mb(device: torch.device) -> float:
    """Peak memory in MiB: CUDA max allocated on a GPU, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def _moments(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(count, sum, sum of squares)`` and ``(max, -min)`` of ``values[mask]``, float64, for global reduction."""
    v = values.to(torch.float64)
    picked = v[mask]
    sums = torch.stack([mask.sum().to(torch.float64), picked.sum(), (picked * picked).sum()])
    empty = picked.numel() == 0
    extremes = torch.stack(
        [
            picked.max() if not empty else v.new_tensor(-torch.inf),
            (-picked).max() if not empty else v.new_tensor(-torch.inf),
        ]
    )
    return sums, extremes


def _stats(prefix: str, sums: Tensor, extremes: Tensor, std: bool = True) -> dict[str, float]:
    count, total, squares = sums.tolist()
    mean = total / max(count, 1.0)
    out = {f"{prefix}/mean": mean}
    if std:  # sample std (Bessel), as torch.std and TRL report it
        out[f"{prefix}/std"] = (max(squares - count * mean * mean, 0.0) / max(count - 1.0, 1.0)) ** 0.5
    out[f"{prefix}/min"], out[f"{prefix}/max"] = -float(extremes[1]), float(extremes[0])
    return out


def batch_statistics(
    experience: Any, group_size: int, max_new_tokens: int, eos_token_ids: list[int], plan: TagPlan
) -> dict[str, float]:
    """Global statistics of one scored rollout batch: rewards, advantages, lengths, entropy of masked / kept tokens
    and the masked share of response tokens (the overview's card).

    Every rank must call it (two all-reduces). Rows are grouped by prompt, ``group_size`` consecutive rows each.

    Args:
        experience: an :class:`~lit_entropy.step.Experience` (``rewards`` ``[N]``, ``advantages``/``entropy``
            ``[N, T]``, ``response_mask`` and ``loss_mask`` bool ``[N, T]``).
        group_size: samples per prompt.
        max_new_tokens: the sampling length limit: a completion of this length without an EOS is truncated.
        eos_token_ids: ids that end a completion.
        plan: which optional tags to compute.
    """
    mask, rewards = experience.response_mask, experience.rewards
    lengths = mask.sum(-1)
    truncated = truncated_trajectories(experience.rollout, max_new_tokens, eos_token_ids)  # multi-turn: stop "length"
    grouped = rewards.view(-1, group_size)
    all_equal = (grouped.max(-1).values == grouped.min(-1).values).sum()
    parts = [
        _moments(rewards, torch.ones_like(rewards, dtype=torch.bool)),
        _moments(experience.advantages, mask),
        _moments(lengths, torch.ones_like(lengths, dtype=torch.bool)),
    ]
    non_binary = ((rewards != 0) & (rewards != 1)).sum()
    counts = [truncated.sum(), all_equal, torch.tensor(grouped.shape[0], device=mask.device), non_binary]
    if plan.mask_providers:
        kept = experience.loss_mask & mask
        entropy = experience.entropy.to(torch.float64)
        for part in (mask & ~kept, kept):
            counts += [part.sum(), torch.where(part, entropy, 0.0).sum()]
    sums = all_reduce_sum(torch.cat([torch.cat([p[0] for p in parts]), torch.stack(counts).to(torch.float64)]))
    extremes = all_reduce_max(torch.cat([p[1] for p in parts]))
    out = _stats("train/reward", sums[0:3], extremes[0:2])
    out.update(_stats("train/update/advantage", sums[3:6], extremes[2:4]))
    out.update(_stats("train/length", sums[6:9], extremes[4:6], std=False))
    n_rows, n_truncated, n_equal, n_groups, n_non_binary = float(sums[6]), *sums[9:13].tolist()
    out["train/length/truncated_frac"] = n_truncated / max(n_rows, 1.0)
    out["non_binary_rewards"] = n_non_binary  # not a tag: TrainDashboard decides on reward min / max with it
    if plan.grouped:
        out["train/reward/frac_zero_std"] = n_equal / max(n_groups, 1.0)
    if plan.mask_providers:
        n_masked, h_masked, n_kept, h_kept = sums[13:17].tolist()
        if n_masked > 0:  # a global count: every rank takes the same branch
            out["train/entropy/masked"] = h_masked / n_masked
        out["train/entropy/kept"] = h_kept / max(n_kept, 1.0)
        out[MASKED_FRAC_TAG] = n_masked / max(float(sums[3]), 1.0)
        if plan.mask_providers > 1:
            out["train/mask/loss_token_frac"] = n_kept / max(float(sums[3]), 1.0)
    return out


def estimator_input_scalars(inputs: dict[str, Any], device: torch.device) -> dict[str, float]:
    """Global means over rows of what the estimator read besides the rewards: ``train/reward_component/<name>``
    per named reward component (``[N, K]``, weights not applied) and ``train/reward/greedy``, the greedy
    completions' reward (``remax``'s baseline). Every rank calls it (one all-reduce when there is anything).

    Args:
        inputs: an :class:`~lit_entropy.step.Experience`'s ``estimator_inputs``.
        device: where the all-reduce runs.
    """
    columns, tags = [], []
    if "reward_components" in inputs:
        columns.append(inputs["reward_components"].to(device, torch.float64))
        names = inputs.get("reward_component_names", ())
        tags += [f"train/reward_component/{name}" for name in names]
    if "reward_baselines" in inputs:
        columns.append(inputs["reward_baselines"].to(device, torch.float64).unsqueeze(-1))
        tags.append("train/reward/greedy")
    if not columns:
        return {}
    values = torch.cat(columns, dim=-1)
    sums = all_reduce_sum(torch.cat([values.sum(0), values.new_tensor([values.shape[0]])]))
    return {tag: float(total) / max(float(sums[-1]), 1.0) for tag, total in zip(tags, sums[:-1], strict=True)}


def loss_scalars(terms: dict[str, float], plan: TagPlan) -> dict[str, float]:
    """Tags of an update's mean loss terms (per rank; average them across ranks) and its gradient norm."""
    out = {LOSS_TAGS[key]: value for key, value in terms.items() if key in LOSS_TAGS}
    out["train/optim/grad_norm"] = terms["grad_norm"]
    if plan.off_policy:
        out["train/clip/approx_kl"] = terms["approx_kl"]
        if "value_clip_frac" in terms:
            out["train/clip/value"] = terms["value_clip_frac"]
    return out


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
        sums, extremes = _moments(experience.rollout_gap.abs(), mask)
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


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:300]


def informative_groups(rewards: Tensor, group_size: int) -> list[int]:
    """Prompt indices, groups whose rewards differ most first (reward std within the group, descending).

    A group whose samples all got the same reward has zero advantages under group normalisation and teaches
    nothing: those come last, in batch order (ties keep batch order too).

    Args:
        rewards: ``[prompts * group_size]``, ``group_size`` consecutive rewards per prompt.
        group_size: samples per prompt.
    """
    stds = rewards.detach().double().cpu().view(-1, group_size).std(-1, unbiased=False)
    spread = [round(value, 9) for value in stds.tolist()]  # groups with the same rewards in another order tie
    return sorted(range(len(spread)), key=lambda index: -spread[index])


def samples_markdown(
    prompts: list[str],
    answers: list[str],
    completions: list[str],
    rewards: Tensor,
    advantages: Tensor,
    group_size: int,
    num_prompts: int,
) -> str:
    """Every completion of ``num_prompts`` prompts (whole GRPO groups) as a Markdown table, the most informative
    groups first (:func:`informative_groups`).

    Args:
        prompts: one per prompt.
        answers: one per prompt.
        completions: ``group_size`` consecutive completions per prompt.
        rewards: ``[len(completions)]``.
        advantages: ``[len(completions)]``, the advantage of each completion (its first token's).
        group_size: completions per prompt.
        num_prompts: how many prompts to show.
    """
    lines = ["| prompt | answer | # | completion | reward | advantage |", "|---|---|---|---|---|---|"]
    for prompt_idx in informative_groups(rewards, group_size)[:num_prompts]:
        for sample in range(group_size):
            row = prompt_idx * group_size + sample
            head = (_cell(prompts[prompt_idx]), _cell(answers[prompt_idx])) if sample == 0 else ("", "")
            lines.append(
                f"| {head[0]} | {head[1]} | {sample} | {_cell(completions[row])} | "
                f"{float(rewards[row]):.3g} | {float(advantages[row]):+.3g} |"
            )
    return "\n".join(lines)


def log_samples(
    writer: Any, step: int, experience: Any, batch: dict[str, Any], completions: list[str], num_prompts: int,
    tokenizer: Any = None,
) -> None:  # fmt: skip
    """Write the token-entropy histogram and a table of whole sample groups to a TensorBoard ``writer``; a multi-turn
    row shows its whole conversation with roles and its masked spans (``tokenizer`` decodes them).

    Use ``step = lit_entropy.internals.lightning.logger_step(trainer)`` so they line up with the step's scalars.
    """
    mask = experience.response_mask
    group = len(completions) // len(batch["prompts"])
    if experience.rollout.trajectories is not None and tokenizer is not None:
        completions = conversation_cells(experience.rollout, tokenizer)
    writer.add_histogram("train/entropy/tokens", experience.entropy[mask].float().cpu(), step)
    first = experience.advantages[:, 0] if experience.advantages.dim() == 2 else experience.advantages
    table = samples_markdown(
        batch["prompts"], batch["answers"], completions, experience.rewards, first, group, num_prompts
    )
    writer.add_text("train/samples", table, step)

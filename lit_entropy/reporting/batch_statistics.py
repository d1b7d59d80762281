"""The global statistics of one scored rollout batch: ``train/reward/*``, ``train/update/advantage/*``,
``train/length/*``, the entropy of masked / kept tokens, ``train/filter/*`` and the estimator's other inputs.

Sums, minima and maxima are reduced across ranks here, so the tags are logged without Lightning's ``sync_dist``
averaging, which would turn a global minimum into a mean of minima.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_max, all_reduce_sum
from lit_entropy.reporting.multi_turn import truncated_trajectories
from lit_entropy.reporting.overview import MASKED_FRAC_TAG
from lit_entropy.reporting.tag_plan import TagPlan

__all__ = ["batch_statistics", "estimator_input_scalars", "fill_scalars", "masked_moments", "moment_stats"]


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


def masked_moments(values: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """``(count, sum, sum of squares)`` and ``(max, -min)`` of ``values[mask]``, float64, for global reduction (sum
    the first across ranks, take the maximum of the second)."""
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


def moment_stats(prefix: str, sums: Tensor, extremes: Tensor, std: bool = True) -> dict[str, float]:
    """``<prefix>/mean``, ``/std`` (with ``std``), ``/min`` and ``/max`` from reduced :func:`masked_moments`."""
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
        masked_moments(rewards, torch.ones_like(rewards, dtype=torch.bool)),
        masked_moments(experience.advantages, mask),
        masked_moments(lengths, torch.ones_like(lengths, dtype=torch.bool)),
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
    out = moment_stats("train/reward", sums[0:3], extremes[0:2])
    out.update(moment_stats("train/update/advantage", sums[3:6], extremes[2:4]))
    out.update(moment_stats("train/length", sums[6:9], extremes[4:6], std=False))
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

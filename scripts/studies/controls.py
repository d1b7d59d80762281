"""Study-side callbacks of the sum-or-difference forking study (``scripts/studies/sod/run.py``).

* :class:`ReplayedCountMasking`: the count-matched random-mask control. It masks, at every step, exactly as
  many negative-advantage tokens as the Clip_B run of the same seed masked at that step (read from that run's
  ``train.csv``), chosen uniformly at random, so the control stays count-matched over the whole run (the old
  ``RandomNegativeMasking`` matched the count Clip_B *would* mask on the control's own batches, which drifts
  once the two policies differ). With ``by_role`` the counts are matched separately for the strategy token
  (response position 0) and the execution tokens.
* :class:`RoleRecorder`: per-step entropy, masked counts and shares by token role (an observer).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from lightning.pytorch import Callback
from torch import Tensor

ROLES = ("strategy", "exec")


def role_masks(mask: Tensor) -> dict[str, Tensor]:
    """``{"strategy": response position 0, "exec": every later response token}``, each ``[B, T]`` bool."""
    first = torch.zeros_like(mask)
    first[:, 0] = True
    return {"strategy": mask & first, "exec": mask & ~first}


def read_counts(train_rows: list[dict[str, str]]) -> dict[int, dict[str, int]]:
    """``{step: {"strategy": n, "exec": n}}`` masked counts per step of a finished run's train rows."""
    return {int(r["step"]): {role: int(r[f"masked_n_{role}"]) for role in ROLES} for r in train_rows}


class ReplayedCountMasking(Callback):
    """Mask a replayed number of random A < 0 tokens at every step (single process).

    Args:
        counts: ``{step: {"strategy": n, "exec": n}}`` (1-based optimizer step, as :func:`read_counts` returns).
        by_role: match the count of each role separately; False: the total, drawn among all A < 0 tokens.
        seed: seeds the random choice.
    """

    required_fields = frozenset({"mask", "advantages"})

    def __init__(self, counts: dict[int, dict[str, int]], by_role: bool = False, seed: int = 0) -> None:
        self.counts = counts
        self.by_role = by_role
        self.generator = torch.Generator().manual_seed(seed)
        self.shortfall = 0  # replayed tokens that found no A < 0 candidate (reported by the recorder)

    def keep_mask(self, trainer: Any, pl_module: Any, context: Any) -> Tensor:
        step = int(trainer.global_step) + 1  # the step this batch's update will be
        if step not in self.counts:
            raise ValueError(f"ReplayedCountMasking: no replayed count for step {step} (the Clip_B run is shorter)")
        wanted = self.counts[step]
        neg = context.mask & (context.advantages < 0)
        keep = context.mask.clone().flatten()
        groups = role_masks(neg) if self.by_role else {"all": neg}
        for name, sel in groups.items():
            count = sum(wanted.values()) if name == "all" else wanted[name]
            candidates = sel.flatten().nonzero().squeeze(-1)
            order = torch.randperm(candidates.numel(), generator=self.generator)[:count]
            keep[candidates[order]] = False
            self.shortfall += max(count - candidates.numel(), 0)
        return keep.view_as(context.mask)


class RoleRecorder(Callback):
    """Per-step rows: entropy, masked count and masked share of negative-advantage tokens, by role; reward.

    ``rows`` gets one dict per optimizer step (``step`` 1-based) with ``entropy_<role>``, ``masked_n_<role>``,
    ``masked_neg_<role>`` (masked share of the role's A < 0 tokens), ``tokens_<role>`` and ``reward_mean``.
    """

    required_fields = frozenset({"mask", "advantages", "entropy"})

    def __init__(self, on_step: Any = None) -> None:
        self.rows: list[dict[str, Any]] = []
        self.on_step = on_step  # called as on_step(step, pl_module) after each step (evaluation)
        self._pending: dict[str, Any] = {}

    def observe_keep_mask(self, trainer: Any, pl_module: Any, context: Any, keep: Tensor) -> None:
        ent, adv = context.entropy.float(), context.advantages
        row: dict[str, Any] = {}
        for role, sel in role_masks(context.mask).items():
            neg = sel & (adv < 0)
            row[f"entropy_{role}"] = float(ent[sel].sum() / sel.sum().clamp(min=1))
            row[f"masked_n_{role}"] = int((sel & ~keep).sum())
            row[f"masked_neg_{role}"] = float((neg & ~keep).sum() / neg.sum().clamp(min=1))
            row[f"tokens_{role}"] = int(sel.sum())
        self._pending = row

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        if self.on_step is not None:
            self.on_step(int(trainer.global_step), pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = int(trainer.global_step)
        reward = trainer.callback_metrics.get("train/reward/mean")
        self.rows.append(
            {"step": step, "reward_mean": float(reward) if reward is not None else math.nan, **self._pending}
        )
        if self.on_step is not None:
            self.on_step(step, pl_module)

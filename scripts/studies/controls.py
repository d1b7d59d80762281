"""Study-side callbacks of the sum-or-difference forking study (``scripts/studies/sod/run.py``).

* :class:`ReplayedCountMasking`: the count-matched random-mask control. It masks, at every step, exactly as
  many negative-advantage tokens as the Clip_B run of the same seed masked at that step (read from that run's
  ``train.csv``), chosen uniformly at random, so the control stays count-matched over the whole run (the old
  ``RandomNegativeMasking`` matched the count Clip_B *would* mask on the control's own batches, which drifts
  once the two policies differ). With ``by_role`` the counts are matched separately for the strategy token
  (response position 0) and the execution tokens.
* :class:`RoleRecorder`: per-step entropy, masked counts and shares by token role (an observer); with
  ``acted_on`` also the tokens each method callback acted on (masked, penalised, reweighted), by role, and the
  scalars it logged (experiment F's "acts on" quantities).
"""

from __future__ import annotations

import json
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
    """Per-rollout-batch rows: entropy, masked count and masked share of negative-advantage tokens, by role; reward.

    ``rows`` gets one dict per rollout batch (``step`` 1-based: the optimizer step when there is one update per
    batch) with ``entropy_<role>``, ``masked_n_<role>``, ``masked_neg_<role>`` (masked share of the role's A < 0
    tokens), ``tokens_<role>`` and ``reward_mean``; with several updates per batch or ``acted_on`` also
    ``optimizer_step``.

    Args:
        on_step: called as ``on_step(batch, pl_module)`` at the start (0) and after each rollout batch.
        updates_per_batch: optimizer steps per rollout batch (``trainer.global_step`` counts optimizer steps).
        acted_on: also record ``acted_n_<role>`` (tokens the trainer's other token callbacks acted on, as they
            count them with ``count_tokens``) and ``method_metrics``: the scalars those callbacks logged for the
            batch (``last_metrics``: coefficient, gate, phase, zeta, shares), as one JSON object.
    """

    required_fields = frozenset({"mask", "advantages", "entropy"})

    def __init__(self, on_step: Any = None, updates_per_batch: int = 1, acted_on: bool = False) -> None:
        if updates_per_batch < 1:
            raise ValueError(f"RoleRecorder: updates_per_batch must be >= 1, got {updates_per_batch}")
        self.rows: list[dict[str, Any]] = []
        self.on_step = on_step  # called as on_step(batch, pl_module) after each rollout batch (evaluation)
        self.updates_per_batch = updates_per_batch
        self.acted_on = acted_on
        self._pending: dict[str, Any] = {}
        self._acted = dict.fromkeys(ROLES, 0)
        self._watched: list[Any] = []

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not self.acted_on:
            return
        # Every method callback tallies what it acted on through count_tokens(mask, acted_on); wrapping that one
        # call on the instance reads the same tokens, split by role, without touching the library.
        for cb in trainer.callbacks:
            count_tokens = getattr(cb, "count_tokens", None)
            if cb is self or count_tokens is None or cb in self._watched:
                continue
            cb.count_tokens = self._counting(count_tokens)
            self._watched.append(cb)

    def _counting(self, count_tokens: Any) -> Any:
        def wrapped(mask: Tensor, acted_on: Tensor | None = None) -> None:
            if acted_on is not None:
                for role, sel in role_masks(mask & acted_on).items():
                    self._acted[role] += int(sel.sum())
            count_tokens(mask, acted_on)

        return wrapped

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
        optimizer_step = int(trainer.global_step)
        step = optimizer_step // self.updates_per_batch  # the rollout batch just trained on
        reward = trainer.callback_metrics.get("train/reward/mean")
        row = {"step": step, "reward_mean": float(reward) if reward is not None else math.nan, **self._pending}
        if self.updates_per_batch > 1 or self.acted_on:  # F's arms: one column set whatever the recipe
            row["optimizer_step"] = optimizer_step
        if self.acted_on:
            row.update({f"acted_n_{role}": n for role, n in self._acted.items()})
            # One JSON column, so that every arm's train.csv has the same columns (one experiment table).
            metrics = {k: v for cb in self._watched for k, v in getattr(cb, "last_metrics", {}).items()}
            for cb in self._watched:  # the adaptive bonus logs nothing of its own: its coefficient is the quantity
                if isinstance(getattr(cb, "coef", None), float):
                    metrics[cb.tag("coef")] = cb.coef
            row["method_metrics"] = json.dumps(metrics, sort_keys=True)
            self._acted = dict.fromkeys(ROLES, 0)
        self.rows.append(row)
        if self.on_step is not None:
            self.on_step(step, pl_module)

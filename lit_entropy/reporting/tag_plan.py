"""Which optional ``train/*`` tags a run logs: :class:`TagPlan`, decided once from what the run is made of, the
same on every rank (a tag is logged only when it can carry information in the run); the update-loss tags."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from lit_entropy import protocol
from lit_entropy.functional.registry import policy_loss_attribute
from lit_entropy.rollout.base import RolloutEngine
from lit_entropy.settings import LossConfig, OptimConfig

__all__ = ["LOSS_TAGS", "TagPlan", "loss_scalars", "module_tag_plan"]

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


def loss_scalars(terms: dict[str, float], plan: TagPlan) -> dict[str, float]:
    """Tags of an update's mean loss terms (per rank; average them across ranks) and its gradient norm."""
    out = {LOSS_TAGS[key]: value for key, value in terms.items() if key in LOSS_TAGS}
    out["train/optim/grad_norm"] = terms["grad_norm"]
    if plan.off_policy:
        out["train/clip/approx_kl"] = terms["approx_kl"]
        if "value_clip_frac" in terms:
            out["train/clip/value"] = terms["value_clip_frac"]
    return out

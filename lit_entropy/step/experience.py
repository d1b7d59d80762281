"""A scored rollout batch with everything the update epochs need (Lightning-free)."""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.functional.overlong import overlong_penalty, truncated_rows
from lit_entropy.functional.registry import ADVANTAGE_ESTIMATORS, estimator_needs_values, outcome_token_rewards
from lit_entropy.functional.rollout_correction import mismatch_sums, rollout_correction
from lit_entropy.protocol import TokenMaskContext
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import RFTSettings, UpdateConfig
from lit_entropy.step.forward import ResponseForward
from lit_entropy.step.micro_batches import forward_rows, micro_batches, trim_rollout
from lit_entropy.tokens import PassStatistics, PolicyStatistics, RolloutRows

__all__ = [
    "Experience",
    "ReusedForwards",
    "RolloutStatistics",
    "advantage_options",
    "build_experience",
    "rollout_mismatch",
    "token_advantages",
]

ReusedForwards = list[tuple[Tensor | slice, ResponseForward]]
"""The statistics pass's policy forwards with their graphs, when they double as the only update's forwards: one
``(rows, forward)`` per forward, ``rows`` either ``slice(None)`` (one forward over all rows, in order) or a
token-budget micro-batch's row index (:func:`~lit_entropy.step.micro_batches.micro_batches`; the forward ran on
those rows trimmed to their widths, an empty index on row 0)."""


@dataclass(kw_only=True)
class RolloutStatistics(PassStatistics, PolicyStatistics[Tensor]):
    """What the statistics pass over a rollout batch computed: the policy's and the other passes' statistics
    (:class:`~lit_entropy.tokens.PolicyStatistics`, :class:`~lit_entropy.tokens.PassStatistics`), ``[N, T]``
    (detached; the graph, when kept, is in ``update_forward``).

    Attributes:
        update_forward: the policy forwards with their graphs, when they double as the only update's forwards.
    """

    update_forward: ReusedForwards | None = None

    @classmethod
    def from_passes(
        cls,
        stats: EntropyStats,
        *,
        ref_logprobs: Tensor | None = None,
        old_values: Tensor | None = None,
        update_forward: ReusedForwards | None = None,
        kept_log_mass: Tensor | None = None,
    ) -> RolloutStatistics:
        """The statistics of the policy's pass (``stats``), the reference's log-probs and the critic's values,
        detached; ``update_forward`` keeps the policy passes' graphs when the update reuses them."""
        out = cls(
            old_logprobs=stats.logprobs,
            entropy=stats.entropy,
            discriminator=stats.discriminator,
            policy_average=stats.policy_average,
            ref_logprobs=ref_logprobs,
            old_values=old_values,
            kept_log_mass=kept_log_mass,
            update_forward=update_forward,
        )
        return out.detach()

    @classmethod
    def in_row_order(cls, parts: list[tuple[Tensor | slice, RolloutStatistics]], width: int) -> RolloutStatistics:
        """The statistics of the forwards of one batch as one: parts over slices are concatenated in order; parts
        over index tensors (token-budget micro-batches, trimmed) are widened to ``width`` columns and put back in row
        order, empty ones (which only kept the ranks in step) dropped. A plan is all slices or all index tensors."""
        indexed = [(index, stats) for index, stats in parts if isinstance(index, Tensor)]
        if not indexed:
            return cls.cat([stats for _, stats in parts])
        if len(indexed) != len(parts):
            raise ValueError("RolloutStatistics.in_row_order: the parts mix slices and row-index tensors")
        kept = [(index, stats) for index, stats in indexed if index.numel()]
        out = cls.cat([stats.widen_columns(width) for _, stats in kept])
        return out.rows(torch.argsort(torch.cat([index for index, _ in kept])))


@dataclass(kw_only=True)
class Experience(RolloutRows):
    """One rollout batch after scoring and the statistics pass; rows grouped by prompt; built by keyword.

    Holds every per-row tensor (:class:`~lit_entropy.tokens.RolloutRows`; ``N`` = prompts x samples, ``T`` =
    response length); :meth:`rows` selects a mini-batch of all of them.

    Attributes:
        rollout: the sampled batch.
        update_forward: the update's own forwards (with their graphs) when they double as the statistics pass.
        coefficients: loss coefficients for this batch (``entropy_coef``: the setting or a callback's value).
        mismatch: this rank's :func:`~lit_entropy.functional.rollout_correction.mismatch_sums` of the whole batch
            (float64 ``[10]``), None unless the engine reports log-probs.
        estimator_inputs: what the estimator read besides the rewards
            (:func:`~lit_entropy.step.estimator_inputs.estimator_inputs`), of the whole batch (:meth:`rows` does not
            select them): the dashboard's ``train/reward_component/*`` and ``train/reward/greedy``.
    """

    rollout: RolloutBatch
    update_forward: ReusedForwards | None = None
    coefficients: dict[str, float] = field(default_factory=dict)
    mismatch: Tensor | None = None
    estimator_inputs: dict[str, Any] = field(default_factory=dict)

    @property
    def response_mask(self) -> Tensor:
        return self.rollout.response_mask

    def token_context(self) -> TokenMaskContext:
        """The :class:`~lit_entropy.protocol.TokenMaskContext` that callbacks read for this batch."""
        return TokenMaskContext.of(self, mask=self.response_mask)

    def rows(self, index: Tensor | slice) -> Experience:
        """The selected rows of every row tensor and of the rollout (``update_forward``, which covers all rows,
        is dropped)."""
        return super().rows(index).with_row_tensors({}, rollout=self.rollout.select(index), update_forward=None)

    def micro_batch(self, index: Tensor, *, trim: bool) -> Experience:
        """The rows ``index``, trimmed to their own widths when ``trim``; an empty ``index`` (a rank with fewer rows
        than micro-batches) gives row 0 with an empty loss mask, whose backward adds nothing but keeps the ranks'
        gradient collectives in step."""
        rows = self.rows(forward_rows(index))
        if not index.numel():
            rows.loss_mask = torch.zeros_like(rows.loss_mask)
        return rows.trimmed() if trim else rows

    def update_parts(
        self, index: Tensor, update: UpdateConfig
    ) -> Iterator[tuple[Tensor, Experience, ResponseForward | None]]:
        """``(rows, their experience, their forward or None)`` per forward of one optimizer step on the rows
        ``index``: the statistics pass's own forwards when the update reuses them (``update_forward``, which then
        covers exactly ``index``), else :func:`~lit_entropy.step.micro_batches.micro_batches` (a collective under a
        token budget), each trimmed to its widths under a token budget."""
        if self.update_forward is not None:
            for part, forward in self.update_forward:
                rows = index if isinstance(part, slice) else part  # slice(None): all rows, in order
                yield rows, self.micro_batch(rows, trim=isinstance(part, Tensor)), forward
            return
        trim = update.max_tokens_per_micro_batch is not None
        for rows in micro_batches(self.rollout, update, index):
            yield rows, self.micro_batch(rows, trim=trim), None

    def trimmed(self) -> Experience:
        """These rows without the columns that are padding on every row
        (:func:`~lit_entropy.step.micro_batches.trim_rollout`); the per-token tensors keep the kept columns."""
        rollout = trim_rollout(self.rollout)
        return self.narrow_columns(rollout.response_mask.shape[1]).with_row_tensors({}, rollout=rollout)


def advantage_options(settings: RFTSettings) -> dict[str, Any]:
    """The keyword options every advantage estimator receives (each reads the ones it needs).

    ``scale`` always; under PPO also ``gamma``, ``lam`` and ``whiten_advantages`` (``model.ppo``).
    """
    options: dict[str, Any] = {"scale": settings.advantages.scale}
    if settings.ppo is not None:
        ppo = settings.ppo
        options.update(gamma=ppo.gamma, lam=ppo.lam, whiten_advantages=ppo.whiten_advantages)
    return options


def token_advantages(
    rewards: Tensor,
    mask: Tensor,
    settings: RFTSettings,
    values: Tensor | None = None,
    inputs: dict[str, Any] | None = None,
    placed: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Advantages ``[N, T]`` float32 (and the critic's returns, or None) by ``model.advantages.estimator``.

    Args:
        rewards: ``[N]`` one reward per completion, rows grouped by prompt; placed at each row's last valid token
            (less what ``placed`` puts elsewhere).
        mask: ``[N, T]`` bool response mask.
        settings: the run's settings (the estimator is resolved by :class:`~lit_entropy.settings.RFTSettings`).
        values: critic values ``[N, T]``; passed only to estimators registered with ``needs_values=True``.
        inputs: per-row estimator inputs (:func:`~lit_entropy.step.estimator_inputs.estimator_inputs`:
            ``reward_baselines``, ``reward_components``, ``reward_weights``), each passed to an estimator that
            takes it by name or by ``**extra``.
        placed: ``[N, T]`` part of ``rewards`` that sits on given tokens (multi-turn per-turn rewards), or None.
    """
    name = settings.advantages.estimator
    assert name is not None, "RFTSettings fills in the algorithm's default estimator"
    estimator = ADVANTAGE_ESTIMATORS[name]
    parameters = inspect.signature(estimator).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    extra = {key: value for key, value in (inputs or {}).items() if takes_any or key in parameters}
    token_rewards = (
        outcome_token_rewards(rewards, mask)
        if placed is None
        else outcome_token_rewards(rewards - placed.sum(-1).to(rewards), mask) + placed.to(rewards)
    )
    advantages, returns = estimator(
        token_rewards,
        mask,
        group_size=settings.sampling.num_samples,
        values=values if estimator_needs_values(name) else None,
        **advantage_options(settings),
        **{key: value.to(mask.device) if isinstance(value, Tensor) else value for key, value in extra.items()},
    )
    return advantages.float(), returns


def rollout_mismatch(
    trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, settings: RFTSettings
) -> tuple[Tensor | None, Tensor]:
    """``model.loss.rollout_correction``'s weights ``[N, T]`` (None when off) and the mismatch sums of the batch.

    Args:
        trainer_logprobs: ``[N, T]`` the statistics pass's log-probs of the sampled tokens.
        rollout_logprobs: ``[N, T]`` the engine's.
        mask: ``[N, T]`` bool response mask.
        settings: the run's settings.
    """
    config = settings.loss.rollout_correction
    level = config.level
    if level is None:  # the correction is off (``config.enabled``)
        return None, mismatch_sums(trainer_logprobs, rollout_logprobs, mask)
    correction = rollout_correction(
        trainer_logprobs, rollout_logprobs, mask, level=level, mode=config.mode, upper=config.upper,
        lower=config.lower,
    )  # fmt: skip
    return correction.weights, mismatch_sums(trainer_logprobs, rollout_logprobs, mask, correction, level=level)


def build_experience(
    rollout: RolloutBatch,
    rewards: Tensor,
    statistics: RolloutStatistics,
    settings: RFTSettings,
    *,
    eos_token_ids: Sequence[int] = (),
    estimator_inputs: dict[str, Any] | None = None,
) -> Experience:
    """Advantages (the registered estimator) and the rollout correction on top of the statistics pass.

    ``rewards`` ``[N]`` are kept as scored (correctness reads them); the advantages see them plus the overlong
    penalty (``model.reward.overlong_buffer``). The loss mask starts as the response mask, less the truncated
    rows under ``model.loss.mask_truncated`` (a row of ``max_new_tokens`` tokens not ending in one of
    ``eos_token_ids``); callbacks narrow it afterwards. With an engine that reports log-probs, the rollout
    correction's weights (``model.loss.rollout_correction``) are kept apart from the advantages: they multiply each
    token's policy-loss term, so the callbacks and the dashboard read the estimator's advantages.
    ``estimator_inputs`` go to the estimator (:func:`token_advantages`).
    """
    mask = rollout.response_mask
    max_new_tokens = settings.sampling.max_new_tokens
    shaped = rewards + overlong_penalty(
        mask.sum(-1),
        max_new_tokens=max_new_tokens,
        buffer=settings.reward.overlong_buffer,
        factor=settings.reward.overlong_penalty_factor,
    ).to(rewards)
    placed = None if rollout.trajectories is None else rollout.trajectories.placed_rewards(mask.shape[1], mask.device)
    advantages, returns = token_advantages(shaped, mask, settings, statistics.old_values, estimator_inputs, placed)
    loss_mask = mask
    if settings.loss.mask_truncated:
        if rollout.trajectories is not None:  # multi-turn: the budget ran out (a turn may end in EOS and still be cut)
            truncated = rollout.trajectories.truncated
        else:
            truncated = truncated_rows(
                rollout.responses, mask, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids
            )
        loss_mask = mask & ~truncated.unsqueeze(-1)
    gap = weights = mismatch = None
    if rollout.rollout_logprobs is not None:
        # The trainer's and the engine's log-probs of the same tokens differ (kernels, precision, the kept set).
        trainer = statistics.old_logprobs
        if statistics.kept_log_mass is not None:  # renormalised over the top-k / top-p set the engine sampled from
            trainer = trainer - statistics.kept_log_mass
        gap = (trainer - rollout.rollout_logprobs).masked_fill(~mask, 0.0)
        weights, mismatch = rollout_mismatch(trainer, rollout.rollout_logprobs, mask, settings)
    tensors = {**statistics.row_tensors(), "rewards": rewards, "advantages": advantages, "returns": returns}
    tensors.update(loss_mask=loss_mask, rollout_gap=gap, rollout_weights=weights)
    return Experience.from_row_tensors(
        tensors, rollout=rollout, update_forward=statistics.update_forward, mismatch=mismatch,
        estimator_inputs=dict(estimator_inputs or {}),
    )  # fmt: skip

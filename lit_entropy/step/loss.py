"""The update loss of some rows of a rollout batch: policy loss plus KL, entropy, penalty and value terms."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypedDict

from torch import Tensor, nn

from lit_entropy.distributed.collectives import all_reduce_sum, unshard_root, world_size
from lit_entropy.functional.losses import PolicyLossStats, aggregate_loss, kl_penalty, loss_normalizer_count, value_loss
from lit_entropy.functional.registry import POLICY_LOSSES
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import LossConfig, RFTSettings
from lit_entropy.step.experience import Experience
from lit_entropy.step.forward import ResponseForward, blockwise_response_loss, response_forward, uses_blockwise_head

__all__ = [
    "SHARE_TERMS",
    "LossAggregation",
    "UpdateLoss",
    "UpdateTerms",
    "global_loss_normalizer",
    "policy_loss_extras",
    "resolved_agg_mode",
    "rows_update_loss",
    "update_loss",
]


SHARE_TERMS = frozenset({"pg_loss", "kl", "entropy_bonus", "token_penalty", "value_loss"})
"""Terms of :class:`UpdateLoss` that are a micro-batch's share of its optimizer step's loss (divided by the step's
global count): they add up over the step's micro-batches. The others (``approx_kl``, ``value_clip_frac``) are
means over the micro-batch's own loss tokens (see :class:`UpdateTerms`)."""


class LossAggregation(TypedDict):
    """How every term of :func:`update_loss` is reduced over its tokens: the keywords of
    :func:`~lit_entropy.functional.losses.aggregate_loss` that the settings and the optimizer step fix."""

    loss_agg_mode: str
    normalizer: float
    loss_scale_factor: float


@dataclass
class UpdateLoss:
    """Result of :func:`update_loss`.

    Attributes:
        loss: the scalar to back-propagate.
        terms: detached scalar terms for logging (``pg_loss``, ``approx_kl``, ``kl``, ``entropy_bonus``,
            ``token_penalty``, ``value_loss``, ``value_clip_frac``: only those that are on).
        policy_stats: the policy loss's own detached diagnostics (clip fractions by *its* clip rule, over the
            loss tokens), for ``train/clip/*``.
        loss_tokens: the number of loss tokens of these rows (the weight of ``policy_stats``' fractions).
    """

    loss: Tensor
    terms: dict[str, Tensor]
    policy_stats: PolicyLossStats
    loss_tokens: Tensor


class UpdateTerms:
    """The loss terms of one update (every micro-batch of every optimizer step), each averaged as it is defined.

    Share terms (:data:`SHARE_TERMS`) add up over a step's micro-batches and are averaged over the steps. The
    token means (``approx_kl``, ``value_clip_frac``: masked means over a micro-batch's loss tokens) are weighted by
    each micro-batch's loss tokens, so the result is their mean over every loss token of the update, whatever the
    split (token-budget micro-batches hold different token counts), as TRL's PPO trainer pools them
    (huggingface/trl#7041); verl and TRL's GRPO trainer average the micro-batches' means unweighted.
    """

    def __init__(self) -> None:
        self.sums: dict[str, float] = {}
        self.tokens = 0.0  # loss tokens of the micro-batches added

    def add(self, out: UpdateLoss) -> None:
        """Count one (non-empty) micro-batch's terms."""
        tokens = float(out.loss_tokens)
        self.tokens += tokens
        for key, value in out.terms.items():
            weight = 1.0 if key in SHARE_TERMS else tokens
            self.sums[key] = self.sums.get(key, 0.0) + float(value) * weight

    def means(self, steps: int) -> dict[str, float]:
        """Each term's mean over the ``steps`` optimizer steps (share terms) or over the loss tokens (0 without)."""
        return {key: value / max(steps if key in SHARE_TERMS else self.tokens, 1) for key, value in self.sums.items()}


def resolved_agg_mode(loss: LossConfig) -> str:
    """``model.loss.loss_agg_mode`` as :class:`~lit_entropy.settings.LossConfig` resolved it at construction (the
    policy loss's paper's mode when null)."""
    assert loss.loss_agg_mode is not None, "LossConfig.__post_init__ fills in the policy loss's default mode"
    return loss.loss_agg_mode


def global_loss_normalizer(mask: Tensor, loss_agg_mode: str) -> float:
    """This rank's share of the global loss denominator of one optimizer step (every rank must call it).

    Args:
        mask: ``[n, T]`` bool loss mask of this rank's rows of the step.
        loss_agg_mode: the aggregation mode.
    """
    world = world_size()
    count = loss_normalizer_count(mask, loss_agg_mode, world).reshape(1)
    return max(float(all_reduce_sum(count)) / world, 1e-12)


def policy_loss_extras(rows: Experience) -> dict[str, Tensor]:
    """The keyword extras every registered policy loss receives: ``response_mask`` (``[n, T]`` bool, every valid
    response token, whatever the callbacks removed from the loss mask), and ``token_weights`` (``[n, T]``, the
    rollout correction's weights of each token's loss term) only when ``model.loss.rollout_correction`` is on."""
    extras = {"response_mask": rows.response_mask}
    if rows.rollout_weights is not None:
        extras["token_weights"] = rows.rollout_weights
    return extras


def update_loss(
    forward: ResponseForward,
    rows: Experience,
    settings: RFTSettings,
    *,
    normalizer: float,
    values: Tensor | None = None,
) -> UpdateLoss:
    """Loss of ``rows`` given their current forward.

    Args:
        forward: the policy's forward over exactly these rows.
        rows: the rows' experience (advantages, old/ref log-probs, loss mask, penalty, PPO targets, and the
            batch's loss ``coefficients``: ``entropy_coef``).
        settings: the run's settings (``loss``, whose ``policy_loss`` names the registered loss; ``ppo`` with
            ``values``; ``sampling.max_new_tokens`` is the Dr.GRPO constant of ``seq-mean-token-sum-norm`` unless
            ``loss.loss_scale_factor`` is set).
        normalizer: global denominator share of the optimizer step (see :func:`global_loss_normalizer`).
        values: current critic values ``[n, T]`` (PPO), else None.
    """
    stats = forward.stats
    return _update_loss(stats.logprobs, stats.entropy, rows, settings, normalizer=normalizer, values=values)


def _update_loss(
    logprobs: Tensor,
    entropy: Tensor,
    rows: Experience,
    settings: RFTSettings,
    *,
    normalizer: float,
    values: Tensor | None = None,
) -> UpdateLoss:
    """:func:`update_loss` of the current ``logprobs`` and ``entropy`` ``[n, T]`` of the sampled tokens (all a loss
    reads of the forward: the blockwise pass forms the loss from these two alone)."""
    config, ppo = settings.loss, settings.ppo
    mask, scale = rows.loss_mask, config.loss_scale_factor or settings.sampling.max_new_tokens
    agg = LossAggregation(loss_agg_mode=resolved_agg_mode(config), normalizer=normalizer, loss_scale_factor=scale)
    loss, pg = POLICY_LOSSES[config.policy_loss](
        logprobs,
        rows.old_logprobs,
        rows.advantages,
        mask,
        clip_ratio_low=config.clip_ratio_low,
        clip_ratio_high=config.clip_ratio_high,
        clip_ratio_c=config.clip_ratio_c,
        **agg,
        **policy_loss_extras(rows),
        **(config.policy_loss_options or {}),
    )
    terms = {"pg_loss": loss.detach(), "approx_kl": pg.approx_kl}
    if config.kl_coef > 0:
        assert rows.ref_logprobs is not None, "a KL term comes with a reference pass (RFTModule.reference_logprobs)"
        kl = aggregate_loss(kl_penalty(logprobs, rows.ref_logprobs, kind=config.kl_type), mask, **agg)
        loss = loss + config.kl_coef * kl
        terms["kl"] = kl.detach()
    entropy_coef = rows.coefficients.get("entropy_coef", config.entropy_coef)
    if entropy_coef != 0:
        bonus = aggregate_loss(entropy, mask, **agg)
        loss = loss - entropy_coef * bonus
        terms["entropy_bonus"] = bonus.detach()
    if rows.penalty is not None:
        penalty = aggregate_loss(rows.penalty * (logprobs - rows.old_logprobs).abs(), mask, **agg)
        loss = loss + penalty
        terms["token_penalty"] = penalty.detach()
    if values is not None:
        # Values come only with model.ppo, whose statistics pass and estimator fill the old values and the returns.
        assert ppo is not None and rows.old_values is not None and rows.returns is not None
        v_loss, v_clip = value_loss(
            values, rows.old_values, rows.returns, mask, clip_range_value=ppo.clip_range_value, **agg
        )
        loss = loss + ppo.value_coef * v_loss
        terms["value_loss"] = v_loss.detach()
        terms["value_clip_frac"] = v_clip
    return UpdateLoss(loss=loss, terms=terms, policy_stats=pg, loss_tokens=mask.sum())


def rows_update_loss(
    model: nn.Module,
    rows: Experience,
    settings: RFTSettings,
    *,
    normalizer: float,
    forward: ResponseForward | None = None,
    values_of: Callable[[RolloutBatch, Tensor | None], Tensor] | None = None,
    hidden: bool = False,
) -> UpdateLoss:
    """:func:`update_loss` of ``rows`` under ``model``, running the policy's forward unless ``forward`` is given.

    The model's own forward takes the blockwise loss path (:func:`~lit_entropy.step.forward.blockwise_response_loss`:
    the gradient formed inside the vocabulary pass, one head-sized matmul fewer) when ``model.policy.blockwise_lm_head``
    is on and the head is a plain linear layer; otherwise :func:`~lit_entropy.step.response_forward` + autograd.

    Args:
        model: the policy.
        rows: the rows' experience.
        settings: the run's settings.
        normalizer: see :func:`update_loss`.
        forward: the policy's forward over exactly these rows, already computed (the statistics pass's graph;
            under FSDP2 the policy's root parameters are gathered again for its backward, see
            :func:`~lit_entropy.distributed.collectives.unshard_root`).
        values_of: ``(rollout, policy hidden states) -> values [n, T]`` (PPO), else None.
        hidden: the full-logits forward must return hidden states (a value head on the policy).
    """
    options = settings.forward_options()
    if forward is None and options["blockwise"] and uses_blockwise_head(model):
        head_loss, forward = blockwise_response_loss(
            model,
            rows.rollout,
            lambda logprobs, entropy: _update_loss(logprobs, entropy, rows, settings, normalizer=normalizer).loss,
            temperature=options["temperature"],
            packed=options["packed"],
        )
        values = None if values_of is None else values_of(rows.rollout, forward.hidden)
        out = update_loss(forward, rows, settings, normalizer=normalizer, values=values)
        # forward.stats are detached, so out.loss has the value term's graph only; head_loss (the same policy
        # terms) carries the head's gradient. The sum keeps out.loss's value.
        out.loss = out.loss + (head_loss - head_loss.detach())
        return out
    if forward is None:
        forward = response_forward(model, rows.rollout, **options, hidden=hidden)
    else:
        unshard_root(model)
    values = None if values_of is None else values_of(rows.rollout, forward.hidden)
    return update_loss(forward, rows, settings, normalizer=normalizer, values=values)

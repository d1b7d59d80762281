"""Entropy-control methods that change the advantages: :class:`~lit_entropy.protocol.TokenAdvantageProvider` callbacks.

Each runs once per rollout batch, on every rank, with statistics of the **global** batch, *before* the keep
masks (so masks, penalties and the :class:`~lit_entropy.callbacks.EntropyDynamicsMonitor` see the advantages
the loss uses). Several compose in callback order, each reading the previous one's advantages.

- :class:`STARE`: surprisal-ranked per-token weights while the batch entropy is below a target.
- :class:`Entrocraft`: only positive / only negative signals outside a scheduled entropy band.
- :class:`AdvantageReweighting`: ``A (alpha p + 1 - alpha)`` (AR-Lopti).
- :class:`UnlikelinessReward`: GRPO of rewards scaled down for likely correct samples.
- :class:`REPOR`: ``A - zeta |A| (log p + H)`` with zeta adapted to the entropy (REPO-R).

The math, its sources and its tests are in :mod:`lit_entropy.functional.control`.
"""

from __future__ import annotations

import math
from typing import Any, Literal

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.distributed.collectives import all_reduce_sum, global_top_k_cut
from lit_entropy.functional.checks import check_choice, check_number
from lit_entropy.functional.control import (
    StareState,
    check_entrocraft_args,
    check_repo_r_args,
    check_reweighting_args,
    check_stare_args,
    check_unlikeliness_args,
    entrocraft_advantages,
    entrocraft_bounds,
    entrocraft_phase,
    repo_r_advantages,
    repo_r_zeta,
    reweighted_advantages,
    sequence_mean_logprobs,
    stare_controller_step,
    stare_selection_count,
    stare_weights,
    unlikeliness_advantages,
    unlikeliness_rewards,
)
from lit_entropy.functional.selection import TopKCut
from lit_entropy.internals.lightning import callback_state_key
from lit_entropy.protocol import TokenMaskContext, rollout_group_size, updates_per_rollout_batch

__all__ = ["REPOR", "STARE", "AdvantageReweighting", "Entrocraft", "UnlikelinessReward"]

_PHASE_CODE = {"positive": 1.0, "grpo": 0.0, "negative": -1.0}


def global_mean_entropy(context: TokenMaskContext) -> float:
    """Token-mean entropy (nats) over the valid tokens of all ranks; NaN for an empty batch. Call on every rank."""
    mask = context.mask
    sums = torch.stack(
        [mask.sum().to(torch.float64), torch.where(mask, context.require("entropy").to(torch.float64), 0.0).sum()]
    )
    count, total = all_reduce_sum(sums).tolist()
    return total / count if count > 0 else math.nan


class AdvantageCallback(TokenCallback):
    """Base of the callbacks that replace the advantages: their request, and a tally of the tokens they changed."""

    token_request = "advantages"

    def tally_changed(self, context: TokenMaskContext, advantages: Tensor) -> None:
        """Count the valid tokens and those whose advantage this callback changed (``acted_on``)."""
        changed = advantages.to(torch.float64) != context.require("advantages").to(torch.float64)
        self.count_tokens(context.mask, changed)


class STARE(AdvantageCallback):
    """STARE: surprisal-guided token-level advantage reweighting, gated by the batch entropy (arXiv 2606.19236).

    Per rollout batch: the controller reads the global token-mean entropy ``H``; while ``H < target_entropy``
    the top ``top_ratio`` share (by surprisal ``-log p_old``) of the ``A > 0`` tokens get weight ``reweight_w``
    (and with ``variant="C2"`` the top share of the ``A < 0`` tokens weight ``reweight_m``); the weights multiply
    the advantages (for the clipped surrogate this is exactly the authors' weighted loss, see
    :mod:`lit_entropy.functional.control.stare`). ``adaptive`` moves W and M by ``alpha`` per batch toward the
    target (their Section 4.4); W and M are checkpointed.

    Quadrants: ``L+`` is the most surprising rewarded tokens, mostly ``S < 0`` (``a_pos_d_neg``): amplifying them
    raises entropy; ``L-`` (C2) damps the surprising penalised tokens (``a_neg_d_neg``), whose update lowers it.

    Selection scope: ``"global"`` (default, the rule of every lit_entropy callback) ranks the candidates of the
    whole batch over all ranks; ``"micro_batch"`` ranks within consecutive chunks of ``micro_batch_rows`` rows of
    each rank's share (None: the rank's whole share), as the authors' code does per micro-batch on each rank.
    The authors select with the current log-probs inside each update; here the rollout log-probs, once per batch
    (equal at the first update on-policy).

    Args:
        top_ratio: ``P``, the reweighted share of each advantage-sign set, in [0, 1] (0.1).
        reweight_w: ``W`` (1.1).
        reweight_m: ``M`` (0.9; variant C2 only).
        target_entropy: the gate: reweight only while the batch entropy (nats) is below it (0.3).
        variant: ``"O1"`` (one-sided, default) or ``"C2"`` (both signs).
        adaptive: move W / M each batch (``W in [1, w_max]``, ``M in [m_min, 1]``).
        alpha: the adaptive step (0.01).
        w_max: the adaptive ceiling of W (1.5).
        m_min: the adaptive floor of M (0.5).
        scope: ``"global"`` or ``"micro_batch"``.
        micro_batch_rows: rows per selection chunk under ``scope="micro_batch"`` (None: each rank's share).
        log_prefix: logs ``<prefix>/gate_on``, ``/entropy``, ``/reweight_w``, ``/reweight_m``, ``/frac`` (reweighted
            share of valid tokens), ``/frac_pos``, ``/frac_neg`` (of the A > 0 / A < 0 tokens).
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs", "entropy"})

    def __init__(
        self,
        top_ratio: float = 0.1,
        reweight_w: float = 1.1,
        reweight_m: float = 0.9,
        target_entropy: float = 0.3,
        variant: Literal["O1", "C2"] = "O1",
        adaptive: bool = False,
        alpha: float = 0.01,
        w_max: float = 1.5,
        m_min: float = 0.5,
        scope: Literal["global", "micro_batch"] = "global",
        micro_batch_rows: int | None = None,
        log_prefix: str = "train/stare",
    ) -> None:
        super().__init__(log_prefix)
        check_stare_args(top_ratio, reweight_w, reweight_m, target_entropy, variant, adaptive, alpha, w_max, m_min)
        check_choice("scope", scope, ("global", "micro_batch"))
        check_number("micro_batch_rows", micro_batch_rows, low=1, integer=True, optional=True)
        self.top_ratio, self.target_entropy, self.variant = float(top_ratio), float(target_entropy), variant
        self.adaptive, self.alpha, self.w_max, self.m_min = adaptive, float(alpha), float(w_max), float(m_min)
        self.scope, self.micro_batch_rows = scope, micro_batch_rows
        self.reweight_w, self.reweight_m = float(reweight_w), float(reweight_m)
        self.gate_on = True

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, variant=self.variant, top_ratio=self.top_ratio)

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """``w A`` for this rank's tokens (the controller updated from this batch first). Call on every rank."""
        entropy = global_mean_entropy(context)
        state = stare_controller_step(
            StareState(self.gate_on, self.reweight_w, self.reweight_m), entropy,
            target_entropy=self.target_entropy, adaptive=self.adaptive, alpha=self.alpha, w_max=self.w_max,
            m_min=self.m_min,
        )  # fmt: skip
        self.gate_on, self.reweight_w, self.reweight_m = state
        weights = self._weights(context) if self.gate_on else torch.ones_like(context.require("advantages"))
        advantages = weights.to(context.require("advantages").dtype) * context.require("advantages")
        self._log(pl_module, context, weights, entropy)
        return advantages

    def _options(self) -> dict[str, Any]:
        return {
            "top_ratio": self.top_ratio, "reweight_w": self.reweight_w, "reweight_m": self.reweight_m,
            "variant": self.variant,
        }  # fmt: skip

    def _weights(self, context: TokenMaskContext) -> Tensor:
        logprobs, advantages, mask = context.require("old_logprobs"), context.require("advantages"), context.mask
        if self.scope == "global":
            surprisal = -logprobs.detach()
            cuts: list[TopKCut | None] = [self._global_cut(surprisal, mask & (advantages > 0))]
            cuts.append(self._global_cut(surprisal, mask & (advantages < 0)) if self.variant == "C2" else None)
            return stare_weights(
                logprobs, advantages, mask, positive_cut=cuts[0], negative_cut=cuts[1], **self._options()
            )
        rows = self.micro_batch_rows or max(mask.shape[0], 1)
        parts = [
            stare_weights(logprobs[i : i + rows], advantages[i : i + rows], mask[i : i + rows], **self._options())
            for i in range(0, mask.shape[0], rows)
        ]
        return torch.cat(parts) if parts else torch.ones_like(advantages)

    def _global_cut(self, surprisal: Tensor, candidates: Tensor) -> TopKCut:
        count = int(all_reduce_sum(candidates.sum().to(torch.float64)).item())
        return global_top_k_cut(surprisal, candidates, stare_selection_count(count, self.top_ratio))

    def _log(self, pl_module: Any, context: TokenMaskContext, weights: Tensor, entropy: float) -> None:
        mask, advantages = context.mask, context.require("advantages")
        reweighted = mask & (weights != 1)
        pos, neg = mask & (advantages > 0), mask & (advantages < 0)
        self.count_tokens(mask, reweighted)
        self.count("pos", pos.sum())
        self.count("acted_on_pos", (pos & reweighted).sum())
        self.count("neg", neg.sum())
        self.count("acted_on_neg", (neg & reweighted).sum())
        c = self.reduce_counts()
        metrics = {
            self.tag("gate_on"): float(self.gate_on),
            self.tag("reweight_w"): self.reweight_w,
            self.tag("reweight_m"): self.reweight_m,
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
            self.tag("frac_pos"): self.share(c["acted_on_pos"], c["pos"]),
            self.tag("frac_neg"): self.share(c["acted_on_neg"], c["neg"]),
        }
        if math.isfinite(entropy):
            metrics[self.tag("entropy")] = entropy
        self.log_metrics(pl_module, metrics)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "gate_on": self.gate_on, "reweight_w": self.reweight_w,
                "reweight_m": self.reweight_m}  # fmt: skip

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.gate_on = bool(state_dict.get("gate_on", self.gate_on))
        self.reweight_w = float(state_dict.get("reweight_w", self.reweight_w))
        self.reweight_m = float(state_dict.get("reweight_m", self.reweight_m))


class Entrocraft(AdvantageCallback):
    """Entrocraft: keep the batch entropy in a band scheduled over training by switching advantages (arXiv 2604.26326).

    Per rollout batch ``s`` (from 1) of ``S``, the band moves from ``(lower_range[0], upper_range[0])`` to
    ``(lower_range[1], upper_range[1])`` (``schedule`` linear or cos). With the global token-mean entropy ``H``:
    above the band only positive signals remain (RAFT++), below it only negative ones (NSR), inside it the
    estimator's advantages (GRPO). ``signal="reward"`` (the authors') clamps the raw reward, which assumes
    signed rewards (their verifier: +1 / -1); with 0/1 rewards below the band nothing is left to learn from,
    and ``signal="advantage"`` clamps the estimator's advantages instead.

    Quadrants: above the band (entropy too high) only the rewarded updates remain, whose likely tokens
    (``a_pos_d_pos``) sharpen the policy; below it (entropy too low) only the penalised ones, which push mass off
    the sampled tokens and on balance raise the entropy; inside it all four quadrants, as GRPO.

    Args:
        lower_range: the lower bound's (start, end) in nats ((0.6, 0.4)).
        upper_range: the upper bound's (start, end) in nats ((0.7, 0.5)).
        schedule: ``"linear"`` or ``"cos"``.
        signal: ``"reward"`` or ``"advantage"``.
        total_batches: ``S``, rollout batches of the run; None derives it from the trainer (``max_steps`` or the
            estimated stepping batches, over the optimizer steps per rollout batch).
        log_prefix: logs ``<prefix>/phase`` (+1 positive only, -1 negative only, 0 GRPO), ``/lower``, ``/upper``,
            ``/entropy`` and ``/frac`` (share of valid tokens whose advantage changed).
    """

    required_fields = frozenset({"mask", "advantages", "entropy", "rewards"})

    def __init__(
        self,
        lower_range: tuple[float, float] = (0.6, 0.4),
        upper_range: tuple[float, float] = (0.7, 0.5),
        schedule: Literal["linear", "cos"] = "linear",
        signal: Literal["reward", "advantage"] = "reward",
        total_batches: int | None = None,
        log_prefix: str = "train/entrocraft",
    ) -> None:
        super().__init__(log_prefix)
        check_entrocraft_args(lower_range, upper_range, schedule, signal)
        check_number("total_batches", total_batches, low=1, integer=True, optional=True)
        self.lower_range = (float(lower_range[0]), float(lower_range[1]))
        self.upper_range = (float(upper_range[0]), float(upper_range[1]))
        self.schedule, self.signal, self.total_batches = schedule, signal, total_batches
        self._warned_unsigned = False

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, lower_range=self.lower_range, upper_range=self.upper_range)

    def run_batches(self, trainer: Any, pl_module: Any) -> int:
        """``S``: ``total_batches``, else the trainer's optimizer steps over the steps per rollout batch."""
        if self.total_batches is not None:
            return self.total_batches
        steps = getattr(trainer, "max_steps", -1)
        if steps is None or steps < 0:
            steps = getattr(trainer, "estimated_stepping_batches", math.inf)
        if not math.isfinite(steps) or steps < 1:
            raise ValueError(
                f"{self.describe()} schedules its band over the run but the run's length is unknown "
                f"(trainer max_steps={getattr(trainer, 'max_steps', None)}); set total_batches or trainer.max_steps"
            )
        return max(int(steps) // updates_per_rollout_batch(pl_module), 1)

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """The switched advantages of this rank's tokens. Call on every rank."""
        lower, upper = entrocraft_bounds(
            self.num_batches + 1, self.run_batches(trainer, pl_module), lower_range=self.lower_range,
            upper_range=self.upper_range, schedule=self.schedule,
        )  # fmt: skip
        entropy = global_mean_entropy(context)
        phase = entrocraft_phase(entropy, lower, upper) if math.isfinite(entropy) else "grpo"
        advantages = entrocraft_advantages(
            context.require("advantages"), context.require("rewards"), context.mask, phase, signal=self.signal
        )
        self.tally_changed(context, advantages)
        self.count("negative_rewards", (context.require("rewards") < 0).sum())
        c = self.reduce_counts()
        if phase == "negative" and self.signal == "reward" and c["negative_rewards"] == 0 and not self._warned_unsigned:
            self._warned_unsigned = True
            rank_zero_warn(
                f"{self.describe()}: the batch entropy is below the band but no reward is negative, so signal='reward' "
                "leaves no advantage at all (the authors' rewards are +1 / -1); use signal='advantage' for 0/1 rewards"
            )
        metrics = {
            self.tag("phase"): _PHASE_CODE[phase], self.tag("lower"): lower, self.tag("upper"): upper,
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
        }  # fmt: skip
        if math.isfinite(entropy):
            metrics[self.tag("entropy")] = entropy
        self.log_metrics(pl_module, metrics)
        return advantages


class AdvantageReweighting(AdvantageCallback):
    """Advantage reweighting by the token's probability, ``A (alpha p_old + 1 - alpha)`` (arXiv 2505.12929, AR-Lopti).

    Quadrants: every update is scaled by a factor in ``[1 - alpha, 1]`` rising with ``p``, so the updates of
    unlikely tokens (``S < 0``: ``a_pos_d_neg`` raises entropy, ``a_neg_d_neg`` lowers it) shrink most relative
    to likely ones.

    Args:
        alpha: the probability's weight, in [0, 1] (0.2).
        negative_weight: extra factor on non-positive advantages (the authors' ``neg_adv_weight``, 1.0).
        log_prefix: logs ``<prefix>/mean_scale`` (mean factor over the tokens with A != 0).
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs"})

    def __init__(
        self, alpha: float = 0.2, negative_weight: float = 1.0, log_prefix: str = "train/advantage_reweighting"
    ) -> None:
        super().__init__(log_prefix)
        check_reweighting_args(alpha, negative_weight)
        self.alpha, self.negative_weight = float(alpha), float(negative_weight)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, alpha=self.alpha)

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """The reweighted advantages of this rank's tokens. Call on every rank."""
        advantages = reweighted_advantages(
            context.require("advantages"), context.require("old_logprobs"), context.mask, alpha=self.alpha,
            negative_weight=self.negative_weight,
        )  # fmt: skip
        nonzero = context.mask & (context.require("advantages") != 0)
        self.tally_changed(context, advantages)
        self.count("nonzero", nonzero.sum())
        self.count(
            "scale_sum", torch.where(nonzero, advantages.double() / context.require("advantages").double(), 0.0).sum()
        )
        c = self.reduce_counts()
        mean_scale = self.share(c["scale_sum"], c["nonzero"]) if c["nonzero"] else 1.0
        self.log_metrics(pl_module, {self.tag("mean_scale"): mean_scale})
        return advantages


class UnlikelinessReward(AdvantageCallback):
    """The unlikeliness reward: GRPO advantages of rewards scaled by ``1 - beta rank / G`` (arXiv 2506.02355).

    Within each group of ``G`` samples, rank 0 is the sample with the lowest mean rollout log-prob; a correct
    sample of rank ``k`` keeps ``1 - beta k / G`` of its reward, so GRPO pushes up the unlikely correct ones more.
    This **replaces** the estimator's advantages by the authors' estimator (GRPO over the scaled rewards, group
    std, eps 1e-6) on the rewards as scored (without ``model.reward.overlong_buffer``'s penalty).

    Quadrants: it lowers ``A`` of the likely correct sequences, whose tokens are mostly ``S > 0``
    (``a_pos_d_pos``, entropy down), and raises it for unlikely ones (more ``a_pos_d_neg``, entropy up).

    Args:
        beta: the rank penalty, in [0, 1] (0.25).
        group_size: samples per prompt; None reads the module's ``group_size()``.
        log_prefix: logs ``<prefix>/frac`` (share of valid tokens whose advantage changed) and ``/scaled_frac``
            (share of rewarded sequences whose reward was scaled down).
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs", "rewards"})

    def __init__(
        self, beta: float = 0.25, group_size: int | None = None, log_prefix: str = "train/unlikeliness"
    ) -> None:
        super().__init__(log_prefix)
        check_unlikeliness_args(beta, group_size)
        self.beta, self.group_size = float(beta), group_size

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, beta=self.beta)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._group_size(pl_module)

    def _group_size(self, pl_module: Any) -> int:
        size = self.group_size or rollout_group_size(pl_module)
        if size is None:
            raise TypeError(
                f"{self.describe()} needs the group size: pass group_size or give {type(pl_module).__name__} "
                "a group_size() method (samples per prompt)"
            )
        return size

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """The unlikeliness advantages of this rank's tokens (groups are whole on every rank). Call on every rank."""
        size = self._group_size(pl_module)
        advantages = unlikeliness_advantages(
            context.require("rewards"), context.require("old_logprobs"), context.mask, group_size=size, beta=self.beta
        ).to(context.require("advantages").dtype)
        scaled = unlikeliness_rewards(
            context.require("rewards"),
            sequence_mean_logprobs(context.require("old_logprobs"), context.mask),
            group_size=size,
            beta=self.beta,
        )
        rewarded = context.require("rewards") != 0
        self.tally_changed(context, advantages)
        self.count("rewarded", rewarded.sum())
        self.count("scaled", (rewarded & (scaled != context.require("rewards").double())).sum())
        c = self.reduce_counts()
        metrics = {
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
            self.tag("scaled_frac"): self.share(c["scaled"], c["rewarded"]),
        }
        self.log_metrics(pl_module, metrics)
        return advantages


class REPOR(AdvantageCallback):
    """REPO-R: ``A - zeta |A| (log p + H)`` with zeta doubled / halved as the entropy is below / above its start.

    ``log p + H`` has the sign of the discriminator S, so the correction moves every token's update toward raising
    the entropy (smaller A for likely tokens, larger for unlikely ones, either sign of A); see
    :mod:`lit_entropy.functional.control.repo` for the equation and the choice of the unpublished initial zeta.
    The first batch's global token-mean entropy is the reference; zeta is updated from the second batch on,
    before it is applied; both are checkpointed.

    Args:
        zeta: the initial strength (0.05; the paper does not publish it).
        zeta_min: floor of the adaptation (1e-4).
        zeta_max: ceiling of the adaptation (1.0).
        log_prefix: logs ``<prefix>/zeta``, ``/entropy``, ``/initial_entropy`` and ``/frac``.
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs", "entropy"})

    def __init__(
        self, zeta: float = 0.05, zeta_min: float = 1e-4, zeta_max: float = 1.0, log_prefix: str = "train/repo_r"
    ) -> None:
        super().__init__(log_prefix)
        check_repo_r_args(zeta, zeta_min, zeta_max)
        self.zeta, self.zeta_min, self.zeta_max = float(zeta), float(zeta_min), float(zeta_max)
        self.initial_entropy: float | None = None

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, zeta_min=self.zeta_min, zeta_max=self.zeta_max)

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """The corrected advantages of this rank's tokens. Call on every rank."""
        entropy = global_mean_entropy(context)
        if math.isfinite(entropy):
            if self.initial_entropy is None:
                self.initial_entropy = entropy
            else:
                self.zeta = repo_r_zeta(
                    self.zeta, entropy, self.initial_entropy, zeta_min=self.zeta_min, zeta_max=self.zeta_max
                )
        advantages = repo_r_advantages(
            context.require("advantages"),
            context.require("old_logprobs"),
            context.require("entropy"),
            context.mask,
            zeta=self.zeta,
        )
        self.tally_changed(context, advantages)
        c = self.reduce_counts()
        metrics = {self.tag("zeta"): self.zeta, self.tag("frac"): self.share(c["acted_on"], c["tokens"])}
        if math.isfinite(entropy):
            metrics[self.tag("entropy")] = entropy
        if self.initial_entropy is not None:
            metrics[self.tag("initial_entropy")] = self.initial_entropy
        self.log_metrics(pl_module, metrics)
        return advantages

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "zeta": self.zeta, "initial_entropy": self.initial_entropy}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.zeta = float(state_dict.get("zeta", self.zeta))
        initial = state_dict.get("initial_entropy", self.initial_entropy)
        self.initial_entropy = None if initial is None else float(initial)

"""The entropy-control toolbox as token-mask / token-penalty callbacks (:mod:`lit_entropy.protocol`).

Each callback acts once per rollout batch, on every rank, with statistics of the **global** batch:

- :class:`ClipCov`: drop a few random high-covariance tokens from the loss (Clip-Cov).
- :class:`KLCov`: put ``coef * |log p - log p_old|`` on the top-covariance tokens (KL-Cov).
- :class:`HighEntropySelection`: train only on the top-``rho`` entropy tokens (80/20 rule).
- :class:`AdaptiveEntropyBonus`: steer the module's entropy-bonus coefficient toward a target entropy.

Mask providers compose by AND (:func:`lit_entropy.protocol.collect_keep_mask`); each logs the share
of valid tokens *it* masked under its own prefix (``<prefix>/frac``), so a composed run says which
tool removed what. A masked token leaves the policy loss *and* the token-count denominator (and the
module's entropy bonus, which uses the same loss mask).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.distributed.collectives import all_gather_counts, all_reduce_sum, global_top_k_cut, is_distributed
from lit_entropy.functional.checks import check_seed
from lit_entropy.functional.entropy import adaptive_entropy_coef, check_adaptive_entropy_args
from lit_entropy.functional.selection import (
    check_clip_cov_args,
    check_high_entropy_args,
    check_kl_cov_args,
    clip_cov_candidates,
    clip_cov_mask,
    covariance_scores,
    high_entropy_count,
    high_entropy_mask,
    kl_cov_coefficients,
    selection_count,
    top_k_mask,
)
from lit_entropy.internals.lightning import callback_state_key
from lit_entropy.protocol import TokenMaskContext, updates_per_rollout_batch

__all__ = ["AdaptiveEntropyBonus", "ClipCov", "HighEntropySelection", "KLCov"]


def _global_means(context: TokenMaskContext) -> tuple[Tensor, int]:
    """Global ``(mean A, mean log p)`` over valid tokens and the global valid count."""
    mask = context.mask
    sums = torch.stack(
        [
            mask.sum().to(torch.float64),
            torch.where(mask, context.require("advantages").to(torch.float64), 0.0).sum(),
            torch.where(mask, context.require("old_logprobs").to(torch.float64), 0.0).sum(),
        ]
    )
    sums = all_reduce_sum(sums)
    n = sums[0]
    return sums[1:] / n.clamp(min=1.0), int(n.item())


class ClipCov(TokenCallback):
    """Clip-Cov: remove a random ``clip_cov_ratio`` share of the high-covariance tokens from the loss.

    ``cov = (A - mean A)(log p_old - mean log p_old)`` over the valid tokens of the global batch;
    candidates have ``clip_cov_lb < cov < clip_cov_ub``; ``max(int(clip_cov_ratio * N), 1)`` of them,
    drawn uniformly over the *global* candidate list with a generator seeded by ``(seed, batch index)``
    (identical on all ranks), are masked: exactly that many (all candidates when fewer), ties or not,
    since the draw ignores the scores. Quadrant: cov > 0 means (A > 0, likely token) or (A < 0,
    unlikely token) -- mostly the entropy-*decreasing* updates of THEORY §2.

    Differences from verl's ``compute_policy_loss_clip_cov`` (documented choices):
    verl zeroes the loss of the picked tokens but keeps them in the token-mean denominator; here they
    leave both. verl re-selects per micro-batch with the current log-probs and skips tokens already
    clipped by the ratio; here the selection is made once per rollout batch from ``old_logprobs``
    (equal to the current ones at the first update on-policy, where no token is ratio-clipped).

    Args:
        clip_cov_ratio: share of the valid tokens to drop, in (0, 1] (verl default 2e-4).
        clip_cov_lb: lower covariance bound (verl default 1.0).
        clip_cov_ub: upper covariance bound (verl default 5.0).
        seed: base seed of the selection, an integer in [0, 2**32 - 1].
        log_prefix: logs ``<prefix>/frac`` (masked share) and ``<prefix>/candidate_frac``.
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs"})

    def __init__(
        self,
        clip_cov_ratio: float = 2e-4,
        clip_cov_lb: float = 1.0,
        clip_cov_ub: float = 5.0,
        seed: int = 0,
        log_prefix: str = "train/clip_cov",
    ) -> None:
        super().__init__(log_prefix)
        check_clip_cov_args(clip_cov_ratio, clip_cov_lb, clip_cov_ub)
        self.clip_cov_ratio = float(clip_cov_ratio)
        self.clip_cov_lb = float(clip_cov_lb)
        self.clip_cov_ub = float(clip_cov_ub)
        self.seed = check_seed("seed", seed)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, ratio=self.clip_cov_ratio, lb=self.clip_cov_lb, ub=self.clip_cov_ub)

    def _generator(self) -> torch.Generator:
        # A different draw per rollout batch, the same on every rank, reproducible after a resume.
        return torch.Generator().manual_seed(self.seed * 1_000_003 + self.num_batches)

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask from global statistics and a global random draw. Must be called on every rank."""
        mask = context.mask
        means, n = _global_means(context)
        cov = covariance_scores(context.require("advantages"), context.require("old_logprobs"), mask, means=means)
        local = int(clip_cov_candidates(cov, mask, lb=self.clip_cov_lb, ub=self.clip_cov_ub).sum())
        counts = all_gather_counts(local, mask.device)
        rank = dist.get_rank() if is_distributed() else 0
        keep = clip_cov_mask(
            context.require("advantages"),
            context.require("old_logprobs"),
            mask,
            ratio=self.clip_cov_ratio,
            lb=self.clip_cov_lb,
            ub=self.clip_cov_ub,
            generator=self._generator(),
            means=means,
            num_valid=n,
            candidate_offset=sum(counts[:rank]),
            total_candidates=sum(counts),
        )
        self.count_tokens(mask, ~keep)
        c = self.reduce_counts()
        metrics = {
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
            self.tag("candidate_frac"): sum(counts) / max(n, 1),
        }
        self.log_metrics(pl_module, metrics)
        return keep


class KLCov(TokenCallback):
    """KL-Cov: penalise ``ppo_kl_coef * |log p - log p_old|`` on the top ``kl_cov_ratio`` tokens by covariance.

    Exactly the top ``max(int(kl_cov_ratio * N), 1)`` tokens of the global batch by ``cov`` (see
    :class:`ClipCov`), ties broken by global token index, found from each rank's own top-k,
    all-gathered (:func:`~lit_entropy.distributed.collectives.global_top_k_cut`); an all-zero-advantage
    batch (every ``cov`` = 0) penalises that many tokens, not all of them.
    A :class:`~lit_entropy.protocol.TokenPenaltyProvider`: the module adds
    ``aggregate(coef * |log p - log p_old|)`` to its loss for every update epoch. The penalty is zero
    at the first on-policy update and restrains those tokens from moving in later epochs /
    mini-batches. Quadrant: the largest-cov tokens, i.e. the strongest entropy-decreasing updates.

    Differences from verl's ``compute_policy_loss_kl_cov``: verl drops the PPO ratio clip entirely in
    this mode (the penalty replaces it); here the module's ratio clip stays. verl selects per
    micro-batch with current log-probs; here once per rollout batch, globally, from ``old_logprobs``.
    The penalty and its gradient are zero at an on-policy update, so KL-Cov acts only from the second
    update on a rollout batch (``ppo_epochs > 1`` or several mini-batches); ``setup`` warns otherwise.

    Args:
        kl_cov_ratio: share of valid tokens penalised, in (0, 1]. Default 2e-3, the value of the
            authors' 7B recipe (``recipe/entropy/7b_kl_cov.sh``); verl's code falls back to 2e-4.
        ppo_kl_coef: the penalty weight (verl default 1.0).
        log_prefix: logs ``<prefix>/frac`` (penalised share of valid tokens).
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs"})
    token_request = "token_penalty"

    def __init__(self, kl_cov_ratio: float = 2e-3, ppo_kl_coef: float = 1.0, log_prefix: str = "train/kl_cov") -> None:
        super().__init__(log_prefix)
        check_kl_cov_args(kl_cov_ratio, ppo_kl_coef)
        self.kl_cov_ratio = float(kl_cov_ratio)
        self.ppo_kl_coef = float(ppo_kl_coef)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, ratio=self.kl_cov_ratio, coef=self.ppo_kl_coef)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if stage == "fit" and updates_per_rollout_batch(pl_module) == 1:
            # One on-policy update per rollout batch: |log p - log p_old| = 0 with zero gradient there.
            rank_zero_warn(
                "KLCov has no effect with one update per rollout batch: set model.update.epochs > 1 or a "
                "model.update.mini_batch_size below the rollout batch"
            )

    def token_penalty(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Per-token coefficients ``[B, T]`` from the global top-k. Must be called on every rank."""
        mask = context.mask
        means, n = _global_means(context)
        cov = covariance_scores(context.require("advantages"), context.require("old_logprobs"), mask, means=means)
        cut = global_top_k_cut(cov, mask, selection_count(n, self.kl_cov_ratio))
        coef = kl_cov_coefficients(
            context.require("advantages"),
            context.require("old_logprobs"),
            mask,
            ratio=self.kl_cov_ratio,
            coef=self.ppo_kl_coef,
            means=means,
            cut=cut,
        )
        self.count_tokens(mask, top_k_mask(cov, mask, cut))
        c = self.reduce_counts()
        self.log_metrics(pl_module, {self.tag("frac"): self.share(c["acted_on"], c["tokens"])})
        return coef


class HighEntropySelection(TokenCallback):
    """Train only on the top-``rho`` entropy tokens ("Beyond the 80/20 Rule", TRL ``top_entropy_quantile``).

    Keeps the ``1 + floor(rho * (N - 1))`` highest-entropy valid tokens of **all ranks** (``N`` valid
    tokens): the tokens with ``entropy >= q``, ``q`` the linear-interpolated ``(1 - rho)``-quantile, when
    all entropies differ (TRL's rule); ties at ``q`` are broken by global token index so that exactly
    that many are kept. Quadrant view: it removes
    the low-entropy positions, where ``|S - E_p[S]|`` is small and updates mostly sharpen an already
    confident choice; what remains are the "forking" positions in all four quadrants.

    Args:
        rho: kept share in (0, 1] (0.2 in the paper; 1.0 keeps everything).
        log_prefix: logs ``<prefix>/frac`` (masked share) and ``<prefix>/threshold`` (nats, the lowest
            kept entropy).
    """

    required_fields = frozenset({"mask", "entropy"})

    def __init__(self, rho: float = 0.2, log_prefix: str = "train/high_entropy") -> None:
        super().__init__(log_prefix)
        check_high_entropy_args(rho)
        self.rho = float(rho)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, rho=self.rho)

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask from the global top-k. Must be called on every rank."""
        mask = context.mask
        n = int(all_reduce_sum(mask.sum().to(torch.float64)).item())
        cut = global_top_k_cut(context.require("entropy"), mask, high_entropy_count(n, self.rho))
        keep = high_entropy_mask(context.require("entropy"), mask, rho=self.rho, cut=cut)
        self.count_tokens(mask, ~keep)
        c = self.reduce_counts()
        metrics = {self.tag("frac"): self.share(c["acted_on"], c["tokens"]), self.tag("threshold"): cut.threshold}
        self.log_metrics(pl_module, metrics)
        return keep


class AdaptiveEntropyBonus(TokenCallback):
    """Adaptive entropy bonus: move the module's entropy-bonus weight toward a target entropy (Skywork-OR1, TRL #6140).

    A :class:`~lit_entropy.protocol.LossCoefficientProvider`. Per rollout batch it reads the global
    mean token entropy ``H``, updates ``coef += delta`` if ``H < entropy_target`` else
    ``coef -= delta``, clamped to ``[coef_min, coef_max]``
    (:func:`~lit_entropy.functional.entropy.bonus.adaptive_entropy_coef`), and returns ``{"entropy_coef": coef}``,
    which the module uses for the update epochs of that batch. Quadrant view: the bonus adds an update that raises
    entropy at every position (``dH = eta * beta * ||S||^2 >= 0``, THEORY §2), independent of A.
    A static bonus is the module's ``model.loss.entropy_coef`` setting without this callback.

    Args:
        entropy_target: target mean token entropy in nats (> 0).
        initial_coef: starting coefficient in ``[coef_min, coef_max]``; None takes the module's ``entropy_coef``
            setting at setup (clamped).
        coef_delta: step of the coefficient per rollout batch (> 0).
        coef_min: lower clamp (>= 0).
        coef_max: upper clamp (>= coef_min).
        log_prefix: unused (kept for compatibility): RFTModule logs the coefficient as
            ``train/loss/entropy_coef`` and the entropy it reacts to as ``train/entropy/mean``.
    """

    required_fields = frozenset({"mask", "entropy"})
    token_request = "loss_coefficients"

    def __init__(
        self,
        entropy_target: float = 0.2,
        initial_coef: float | None = 0.0,
        coef_delta: float = 1e-3,
        coef_min: float = 0.0,
        coef_max: float = 0.05,
        log_prefix: str = "train/adaptive_entropy",
    ) -> None:
        super().__init__(log_prefix)
        check_adaptive_entropy_args(entropy_target, coef_delta, coef_min, coef_max, initial_coef)
        self.entropy_target = float(entropy_target)
        self.coef_delta = float(coef_delta)
        self.coef_min = float(coef_min)
        self.coef_max = float(coef_max)
        self.coef: float | None = None if initial_coef is None else float(initial_coef)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, target=self.entropy_target)

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        name = self.describe()
        loss_coefficients = getattr(pl_module, "loss_coefficients", None)
        current = loss_coefficients() if callable(loss_coefficients) else {}
        if "entropy_coef" not in current:
            raise TypeError(f"{name} needs {type(pl_module).__name__}.loss_coefficients() to include 'entropy_coef'")
        if self.coef is None:
            self.coef = min(max(float(current["entropy_coef"]), self.coef_min), self.coef_max)

    def loss_coefficients(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> dict[str, float]:
        """Update the coefficient from the global mean entropy and return it. Call on every rank."""
        if self.coef is None:
            raise RuntimeError(f"{self.describe()} has no coefficient yet: pass initial_coef or let setup() read it")
        mask = context.mask
        self.count_tokens(mask)
        self.count("entropy_sum", torch.where(mask, context.require("entropy").to(torch.float64), 0.0).sum())
        c = self.reduce_counts()
        self.coef = adaptive_entropy_coef(
            self.coef,
            self.share(c["entropy_sum"], c["tokens"]),
            entropy_target=self.entropy_target,
            coef_delta=self.coef_delta,
            coef_min=self.coef_min,
            coef_max=self.coef_max,
        )
        # Nothing of its own to log: RFTModule logs the coefficient (train/loss/entropy_coef) and this very
        # entropy (train/entropy/mean); self.coef is the value for other modules.
        return {"entropy_coef": self.coef}

    @override
    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "coef": self.coef}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.coef = None if state_dict.get("coef") is None else float(state_dict["coef"])

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

import math
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor

from lit_entropy.distributed.collectives import all_gather_counts, all_reduce_sum, global_top_k_cut, is_distributed
from lit_entropy.functional.covariance import (
    clip_cov_candidates,
    clip_cov_mask,
    covariance_scores,
    high_entropy_count,
    high_entropy_mask,
    kl_cov_coefficients,
    selection_count,
)
from lit_entropy.functional.selection import top_k_mask
from lit_entropy.protocol import TokenMaskContext, check_token_masking_module, updates_per_rollout_batch

__all__ = ["AdaptiveEntropyBonus", "ClipCov", "HighEntropySelection", "KLCov"]


def _check_fraction(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and math.isfinite(value) and 0 < value <= 1):
        raise ValueError(f"{name} must be a number in (0, 1], got {name}={value!r}")
    return float(value)


def _global_means(context: TokenMaskContext) -> tuple[Tensor, int]:
    """Global ``(mean A, mean log p)`` over valid tokens and the global valid count."""
    mask = context.mask
    sums = torch.stack(
        [
            mask.sum().to(torch.float64),
            torch.where(mask, context.advantages.to(torch.float64), 0.0).sum(),
            torch.where(mask, context.old_logprobs.to(torch.float64), 0.0).sum(),
        ]
    )
    sums = all_reduce_sum(sums)
    n = sums[0]
    return sums[1:] / n.clamp(min=1.0), int(n.item())


class _TokenCallback(Callback):
    """Shared protocol check (``setup``), masked-fraction logging and counters of the toolbox callbacks."""

    required_fields: frozenset[str] = frozenset({"mask"})
    log_prefix: str = "train/token_callback"

    def __init__(self) -> None:
        # Running totals, checkpointed: how many tokens this callback has touched so far.
        self.num_batches = 0
        self.num_tokens = 0
        self.num_selected = 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_token_masking_module(pl_module, self.required_fields, type(self).__name__)

    def _count_and_log(
        self, pl_module: Any, mask: Tensor, selected: Tensor | None, extra: dict[str, float]
    ) -> dict[str, float]:
        """All-reduce (valid, selected) counts, update the totals, log ``<prefix>/frac`` (unless
        ``selected`` is None, for observers) plus ``extra``."""
        picked = torch.zeros_like(mask) if selected is None else selected & mask
        counts = all_reduce_sum(torch.stack([mask.sum(), picked.sum()]).to(torch.float64))
        n, n_sel = (float(v) for v in counts.tolist())
        self.num_batches += 1
        self.num_tokens += int(n)
        self.num_selected += int(n_sel)
        metrics = dict(extra) if selected is None else {f"{self.log_prefix}/frac": n_sel / max(n, 1.0), **extra}
        _log(pl_module, metrics)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"num_batches": self.num_batches, "num_tokens": self.num_tokens, "num_selected": self.num_selected}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_batches = int(state_dict["num_batches"])
        self.num_tokens = int(state_dict["num_tokens"])
        self.num_selected = int(state_dict["num_selected"])


def _log(pl_module: Any, metrics: dict[str, float]) -> None:
    log = getattr(pl_module, "log", None)
    if log is None or getattr(pl_module, "_trainer", None) is None:
        return
    for name, value in metrics.items():
        log(name, float(value), on_step=True, on_epoch=False, batch_size=1)


class ClipCov(_TokenCallback):
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
        seed: base seed of the selection.
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
        super().__init__()
        _check_fraction("clip_cov_ratio", clip_cov_ratio)
        if not (math.isfinite(clip_cov_lb) and math.isfinite(clip_cov_ub) and clip_cov_lb < clip_cov_ub):
            raise ValueError(
                f"clip_cov_lb must be < clip_cov_ub (both finite), got clip_cov_lb={clip_cov_lb}, "
                f"clip_cov_ub={clip_cov_ub}"
            )
        self.clip_cov_ratio = float(clip_cov_ratio)
        self.clip_cov_lb = float(clip_cov_lb)
        self.clip_cov_ub = float(clip_cov_ub)
        self.seed = int(seed)
        self.log_prefix = log_prefix

    @property
    def state_key(self) -> str:
        return self._generate_state_key(ratio=self.clip_cov_ratio, lb=self.clip_cov_lb, ub=self.clip_cov_ub)

    def _generator(self) -> torch.Generator:
        # A different draw per rollout batch, the same on every rank, reproducible after a resume.
        return torch.Generator().manual_seed(self.seed * 1_000_003 + self.num_batches)

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask from global statistics and a global random draw. Must be called on every rank."""
        mask = context.mask
        means, n = _global_means(context)
        cov = covariance_scores(context.advantages, context.old_logprobs, mask, means=means)
        local = int(clip_cov_candidates(cov, mask, lb=self.clip_cov_lb, ub=self.clip_cov_ub).sum())
        counts = all_gather_counts(local, mask.device)
        rank = dist.get_rank() if is_distributed() else 0
        keep = clip_cov_mask(
            context.advantages,
            context.old_logprobs,
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
        candidate_frac = sum(counts) / max(n, 1)
        self._count_and_log(pl_module, mask, mask & ~keep, {f"{self.log_prefix}/candidate_frac": candidate_frac})
        return keep


class KLCov(_TokenCallback):
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

    def __init__(self, kl_cov_ratio: float = 2e-3, ppo_kl_coef: float = 1.0, log_prefix: str = "train/kl_cov") -> None:
        super().__init__()
        _check_fraction("kl_cov_ratio", kl_cov_ratio)
        if not (math.isfinite(ppo_kl_coef) and ppo_kl_coef >= 0):
            raise ValueError(f"ppo_kl_coef must be a finite number >= 0, got ppo_kl_coef={ppo_kl_coef!r}")
        self.kl_cov_ratio = float(kl_cov_ratio)
        self.ppo_kl_coef = float(ppo_kl_coef)
        self.log_prefix = log_prefix

    @property
    def state_key(self) -> str:
        return self._generate_state_key(ratio=self.kl_cov_ratio, coef=self.ppo_kl_coef)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_token_masking_module(pl_module, self.required_fields, type(self).__name__, request="token_penalty")
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
        cov = covariance_scores(context.advantages, context.old_logprobs, mask, means=means)
        cut = global_top_k_cut(cov, mask, selection_count(n, self.kl_cov_ratio))
        coef = kl_cov_coefficients(
            context.advantages,
            context.old_logprobs,
            mask,
            ratio=self.kl_cov_ratio,
            coef=self.ppo_kl_coef,
            means=means,
            cut=cut,
        )
        self._count_and_log(pl_module, mask, top_k_mask(cov, mask, cut), {})
        return coef


class HighEntropySelection(_TokenCallback):
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
        super().__init__()
        _check_fraction("rho", rho)
        self.rho = float(rho)
        self.log_prefix = log_prefix

    @property
    def state_key(self) -> str:
        return self._generate_state_key(rho=self.rho)

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask from the global top-k. Must be called on every rank."""
        mask = context.mask
        n = int(all_reduce_sum(mask.sum().to(torch.float64)).item())
        cut = global_top_k_cut(context.entropy, mask, high_entropy_count(n, self.rho))
        keep = high_entropy_mask(context.entropy, mask, rho=self.rho, cut=cut)
        self._count_and_log(pl_module, mask, mask & ~keep, {f"{self.log_prefix}/threshold": cut.threshold})
        return keep


class AdaptiveEntropyBonus(_TokenCallback):
    """Adaptive entropy bonus: move the module's entropy-bonus weight toward a target entropy (Skywork-OR1, TRL #6140).

    A :class:`~lit_entropy.protocol.LossCoefficientProvider`. Per rollout batch it reads the global
    mean token entropy ``H``, updates ``coef += delta`` if ``H < entropy_target`` else
    ``coef -= delta``, clamped to ``[coef_min, coef_max]``, and returns ``{"entropy_coef": coef}``,
    which the module uses for the update epochs of that batch. Quadrant view: the bonus adds an update that raises
    entropy at every position (``dH = eta * beta * ||S||^2 >= 0``, THEORY §2), independent of A.
    A static bonus is the module's ``model.loss.entropy_coef`` setting without this callback.

    Args:
        entropy_target: target mean token entropy in nats (> 0).
        initial_coef: starting coefficient; None takes the module's ``entropy_coef`` setting at setup.
        coef_delta: step of the coefficient per rollout batch (> 0).
        coef_min: lower clamp (>= 0).
        coef_max: upper clamp (>= coef_min).
        log_prefix: unused (kept for compatibility): RFTModule logs the coefficient as
            ``train/loss/entropy_coef`` and the entropy it reacts to as ``train/entropy/mean``.
    """

    required_fields = frozenset({"mask", "entropy"})

    def __init__(
        self,
        entropy_target: float = 0.2,
        initial_coef: float | None = 0.0,
        coef_delta: float = 1e-3,
        coef_min: float = 0.0,
        coef_max: float = 0.05,
        log_prefix: str = "train/adaptive_entropy",
    ) -> None:
        super().__init__()
        if not (math.isfinite(entropy_target) and entropy_target > 0):
            raise ValueError(f"entropy_target must be a finite number > 0, got entropy_target={entropy_target!r}")
        if not (math.isfinite(coef_delta) and coef_delta > 0):
            raise ValueError(f"coef_delta must be a finite number > 0, got coef_delta={coef_delta!r}")
        if not (0 <= coef_min <= coef_max < math.inf):
            raise ValueError(f"need 0 <= coef_min <= coef_max < inf, got coef_min={coef_min}, coef_max={coef_max}")
        if initial_coef is not None and not coef_min <= initial_coef <= coef_max:
            raise ValueError(f"initial_coef must be in [coef_min, coef_max], got initial_coef={initial_coef}")
        self.entropy_target = float(entropy_target)
        self.coef_delta = float(coef_delta)
        self.coef_min = float(coef_min)
        self.coef_max = float(coef_max)
        self.coef: float | None = None if initial_coef is None else float(initial_coef)
        self.log_prefix = log_prefix

    @property
    def state_key(self) -> str:
        return self._generate_state_key(target=self.entropy_target)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        name = type(self).__name__
        check_token_masking_module(pl_module, self.required_fields, name, request="loss_coefficients")
        current = pl_module.loss_coefficients()
        if "entropy_coef" not in current:
            raise TypeError(f"{name} needs {type(pl_module).__name__}.loss_coefficients() to include 'entropy_coef'")
        if self.coef is None:
            self.coef = min(max(float(current["entropy_coef"]), self.coef_min), self.coef_max)

    def loss_coefficients(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> dict[str, float]:
        """Update the coefficient from the global mean entropy and return it. Call on every rank."""
        mask = context.mask
        sums = all_reduce_sum(
            torch.stack([mask.sum().to(torch.float64), torch.where(mask, context.entropy.to(torch.float64), 0.0).sum()])
        )
        entropy = float(sums[1] / sums[0].clamp(min=1.0))
        coef = self.coef + self.coef_delta if entropy < self.entropy_target else self.coef - self.coef_delta
        self.coef = min(max(coef, self.coef_min), self.coef_max)
        # Nothing of its own to log: RFTModule logs the coefficient (train/loss/entropy_coef) and this very
        # entropy (train/entropy/mean); self.coef is the value for other modules.
        self._count_and_log(pl_module, mask, None, {})
        return {"entropy_coef": self.coef}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "coef": self.coef}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.coef = None if state_dict.get("coef") is None else float(state_dict["coef"])

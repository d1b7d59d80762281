"""Entropy-discriminator clipping (Clip_B / Clip_V, arXiv 2602.03392) as a Lightning callback."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_sum, global_top_k_cut
from lit_entropy.functional.clipping import (
    cap_count,
    clip_b_mask,
    clip_v_deviation,
    clip_v_mask,
    clip_v_scores,
    finite_mask,
)
from lit_entropy.functional.masked import masked_moments
from lit_entropy.functional.selection import TopKCut
from lit_entropy.protocol import TokenMaskContext, check_token_masking_module

__all__ = ["EntropyDiscriminatorClipping"]

_DEFAULT_MU = {"clip_b": 2.5, "clip_v": 8.5}
_DEFAULT_MAX_FRAC = 1e-4


class EntropyDiscriminatorClipping(Callback):
    """Mask the tokens whose update would sharpen the policy most (THEORY §3).

    Once per rollout batch the module hands over a :class:`~lit_entropy.protocol.TokenMaskContext`
    (see :mod:`lit_entropy.protocol`); this callback returns the keep mask. Statistics are those
    of the **global** batch: count, sum and sum of squares are all-reduced across ranks, and so
    is Clip_V's cap (an exact top-k, ties broken by global token index), so a 2-process run masks
    exactly the tokens a 1-process run on the same global batch masks.

    Logged per rollout batch (under ``log_prefix``): ``/frac`` (masked share of valid tokens),
    ``/frac_neg`` (of tokens with A < 0), ``/frac_pos`` (of tokens with A > 0; only when ``symmetric``:
    the one-sided rule never masks them), ``/s_mean`` (batch mean of S), ``/nonfinite_frac`` (share of
    valid tokens whose S or E_p[S] is NaN/inf: excluded from the statistics and never masked, see
    :mod:`lit_entropy.functional.clipping`; logged from the first batch that has one on) and, when
    policy averages are present, ``/centred_s_mean`` (batch mean of S - E_p[S]).

    Args:
        method: ``"clip_b"`` (batch-normalised S) or ``"clip_v"`` (policy-centred, capped).
        mu: threshold in standard deviations; None takes 2.5 for clip_b and 8.5 for clip_v.
        max_frac: Clip_V cap on the masked share of valid tokens, in (0, 1]; None for no cap. Clip_B has
            no cap: a value other than the default there is ignored with a warning.
        symmetric: also mask A > 0 tokens beyond +mu std (the reference code is one-sided).
        log_prefix: prefix of the logged metric names.
    """

    def __init__(
        self,
        method: Literal["clip_b", "clip_v"] = "clip_b",
        mu: float | None = None,
        max_frac: float | None = _DEFAULT_MAX_FRAC,
        symmetric: bool = False,
        log_prefix: str = "train/entropy_clip",
    ) -> None:
        if method not in _DEFAULT_MU:
            raise ValueError(f"method must be 'clip_b' or 'clip_v', got method={method!r}")
        mu = _DEFAULT_MU[method] if mu is None else float(mu)
        if not mu > 0:
            raise ValueError(f"mu must be > 0, got mu={mu}")
        if max_frac is not None and not 0 < max_frac <= 1:
            raise ValueError(f"max_frac must be in (0, 1] or None, got max_frac={max_frac}")
        if method == "clip_b" and max_frac not in (None, _DEFAULT_MAX_FRAC):
            warnings.warn(
                f"EntropyDiscriminatorClipping(method='clip_b', max_frac={max_frac}): max_frac is ignored, only "
                "Clip_V caps the masked share; remove max_frac or use method='clip_v'",
                UserWarning,
                stacklevel=2,
            )
        self.method = method
        self.mu = mu
        self.max_frac = max_frac
        self.symmetric = symmetric
        self.log_prefix = log_prefix
        self.required_fields = frozenset(
            {"mask", "advantages", "discriminator"} | ({"policy_average"} if method == "clip_v" else set())
        )
        # Running totals, checkpointed: what share of tokens this callback has removed so far.
        self.num_batches = 0
        self.num_tokens = 0
        self.num_masked = 0
        self.seen_nonfinite = False  # log nonfinite_frac from the first batch with a non-finite S on

    @property
    def state_key(self) -> str:
        return self._generate_state_key(method=self.method, mu=self.mu, symmetric=self.symmetric)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_token_masking_module(
            pl_module, self.required_fields, f"EntropyDiscriminatorClipping(method={self.method!r})"
        )

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask for this rank's tokens from global statistics. Must be called on every rank."""
        mask, advantages = context.mask, context.advantages
        if self.method == "clip_b":
            moments = all_reduce_sum(masked_moments(context.discriminator, finite_mask(context.discriminator, mask)))
            keep = clip_b_mask(
                context.discriminator, advantages, mask, mu=self.mu, symmetric=self.symmetric, moments=moments
            )
        else:
            deviation = clip_v_deviation(context.discriminator, context.policy_average)
            moments = all_reduce_sum(masked_moments(deviation, finite_mask(deviation, mask)))
            cap_cut = self._global_cap_cut(context, moments)
            keep = clip_v_mask(
                context.discriminator,
                context.policy_average,
                advantages,
                mask,
                mu=self.mu,
                max_frac=self.max_frac,
                symmetric=self.symmetric,
                moments=moments,
                cap_cut=cap_cut,
            )
        self._log(pl_module, context, keep)
        return keep

    def _global_cap_cut(self, context: TokenMaskContext, moments: Tensor) -> TopKCut | None:
        """This rank's cut of the global top-k Clip_V candidates (the cap); None without a cap."""
        if self.max_frac is None:
            return None
        scores, candidates = clip_v_scores(
            context.discriminator,
            context.policy_average,
            context.advantages,
            context.mask,
            mu=self.mu,
            symmetric=self.symmetric,
            moments=moments,
        )
        return global_top_k_cut(scores, candidates, cap_count(int(moments[0].item()), self.max_frac))

    def _log(self, pl_module: Any, context: TokenMaskContext, keep: Tensor) -> None:
        mask, advantages = context.mask, context.advantages
        masked = mask & ~keep
        pos, neg = mask & (advantages > 0), mask & (advantages < 0)
        finite = finite_mask(context.discriminator, mask)
        if context.policy_average is not None:
            finite &= torch.isfinite(context.policy_average)
        counts = torch.stack(
            [
                mask.sum(),
                masked.sum(),
                pos.sum(),
                (masked & pos).sum(),
                neg.sum(),
                (masked & neg).sum(),
                finite.sum(),
            ]
        ).to(torch.float64)
        s_moments = masked_moments(context.discriminator, finite)
        totals = [counts, s_moments[1:2]]
        if context.policy_average is not None:
            totals.append(masked_moments(context.discriminator - context.policy_average, finite)[1:2])
        reduced = all_reduce_sum(torch.cat(totals))
        n, n_masked, n_pos, n_masked_pos, n_neg, n_masked_neg, n_finite = reduced[:7].tolist()
        self.num_batches += 1
        self.num_tokens += int(n)
        self.num_masked += int(n_masked)
        log = getattr(pl_module, "log", None)
        if log is None or getattr(pl_module, "_trainer", None) is None:
            return
        self.seen_nonfinite |= n_finite < n  # global counts: every rank agrees
        metrics = {
            f"{self.log_prefix}/frac": n_masked / max(n, 1.0),
            f"{self.log_prefix}/frac_neg": n_masked_neg / max(n_neg, 1.0),
            f"{self.log_prefix}/s_mean": reduced[7].item() / max(n_finite, 1.0),
        }
        if self.symmetric:
            metrics[f"{self.log_prefix}/frac_pos"] = n_masked_pos / max(n_pos, 1.0)
        if self.seen_nonfinite:
            metrics[f"{self.log_prefix}/nonfinite_frac"] = (n - n_finite) / max(n, 1.0)
        if context.policy_average is not None:
            metrics[f"{self.log_prefix}/centred_s_mean"] = reduced[8].item() / max(n_finite, 1.0)
        for name, value in metrics.items():
            log(name, value, on_step=True, on_epoch=False, batch_size=1)

    def state_dict(self) -> dict[str, Any]:
        return {"num_batches": self.num_batches, "num_tokens": self.num_tokens, "num_masked": self.num_masked}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_batches = int(state_dict["num_batches"])
        self.num_tokens = int(state_dict["num_tokens"])
        self.num_masked = int(state_dict["num_masked"])

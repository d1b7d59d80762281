"""Entropy-discriminator clipping (Clip_B / Clip_V, arXiv 2602.03392) as a Lightning callback."""

from __future__ import annotations

import warnings
from typing import Any, Literal

import torch
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.distributed.collectives import all_reduce_sum, global_top_k_cut
from lit_entropy.functional.checks import check_choice
from lit_entropy.functional.masked import masked_moments
from lit_entropy.functional.selection import (
    TopKCut,
    cap_count,
    check_clip_b_args,
    check_clip_v_args,
    check_max_frac,
    clip_b_mask,
    clip_v_deviation,
    clip_v_mask,
    clip_v_scores,
    finite_mask,
)
from lit_entropy.internals.lightning import callback_state_key
from lit_entropy.protocol import TokenMaskContext

__all__ = ["EntropyDiscriminatorClipping"]

_DEFAULT_MU = {"clip_b": 2.5, "clip_v": 8.5}
_DEFAULT_MAX_FRAC = 1e-4


class EntropyDiscriminatorClipping(TokenCallback):
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
    :mod:`lit_entropy.functional.selection.clipping`; logged from the first batch that has one on) and, when
    policy averages are present, ``/centred_s_mean`` (batch mean of S - E_p[S]).

    Args:
        method: ``"clip_b"`` (batch-normalised S) or ``"clip_v"`` (policy-centred, capped).
        mu: threshold in standard deviations, a finite number > 0; None takes 2.5 for clip_b and 8.5 for
            clip_v.
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
        super().__init__(log_prefix)
        check_choice("method", method, tuple(_DEFAULT_MU))
        mu = _DEFAULT_MU[method] if mu is None else mu
        # The checks of the math itself: an argument the mask would refuse at the first batch is refused here.
        if method == "clip_b":
            check_clip_b_args(mu, symmetric)
            check_max_frac(max_frac)  # ignored by Clip_B, but a typo (1.5) is still refused
            if max_frac not in (None, _DEFAULT_MAX_FRAC):
                warnings.warn(
                    f"EntropyDiscriminatorClipping(method='clip_b', max_frac={max_frac}): max_frac is ignored, "
                    "only Clip_V caps the masked share; remove max_frac or use method='clip_v'",
                    UserWarning,
                    stacklevel=2,
                )
        else:
            check_clip_v_args(mu, max_frac, symmetric)
        self.method = method
        self.mu = float(mu)
        self.max_frac = max_frac
        self.symmetric = symmetric
        self.required_fields = frozenset(
            {"mask", "advantages", "discriminator"} | ({"policy_average"} if method == "clip_v" else set())
        )
        self.seen_nonfinite = False  # log nonfinite_frac from the first batch with a non-finite S on

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, method=self.method, mu=self.mu, symmetric=self.symmetric)

    @override
    def hparams(self) -> dict[str, Any]:
        """Method, threshold, symmetry; the cap ``max_frac`` only for Clip_V (Clip_B ignores it)."""
        out = super().hparams()
        if self.method == "clip_b":
            del out["max_frac"]
        return out

    @override
    def describe(self) -> str:
        return f"EntropyDiscriminatorClipping(method={self.method!r})"

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask for this rank's tokens from global statistics. Must be called on every rank."""
        mask, advantages = context.mask, context.require("advantages")
        if self.method == "clip_b":
            moments = all_reduce_sum(
                masked_moments(context.require("discriminator"), finite_mask(context.require("discriminator"), mask))
            )
            keep = clip_b_mask(
                context.require("discriminator"),
                advantages,
                mask,
                mu=self.mu,
                symmetric=self.symmetric,
                moments=moments,
            )
        else:
            deviation = clip_v_deviation(context.require("discriminator"), context.require("policy_average"))
            moments = all_reduce_sum(masked_moments(deviation, finite_mask(deviation, mask)))
            cap_cut = self._global_cap_cut(context, moments)
            keep = clip_v_mask(
                context.require("discriminator"),
                context.require("policy_average"),
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
            context.require("discriminator"),
            context.require("policy_average"),
            context.require("advantages"),
            context.mask,
            mu=self.mu,
            symmetric=self.symmetric,
            moments=moments,
        )
        return global_top_k_cut(scores, candidates, cap_count(int(moments[0].item()), self.max_frac))

    def _log(self, pl_module: Any, context: TokenMaskContext, keep: Tensor) -> None:
        mask, advantages = context.mask, context.require("advantages")
        pos, neg = mask & (advantages > 0), mask & (advantages < 0)
        finite = finite_mask(context.require("discriminator"), mask)
        if context.policy_average is not None:
            finite &= torch.isfinite(context.require("policy_average"))
        self.count_tokens(mask, ~keep)
        self.count("pos", pos.sum())
        self.count("acted_on_pos", (pos & ~keep).sum())
        self.count("neg", neg.sum())
        self.count("acted_on_neg", (neg & ~keep).sum())
        self.count("finite", finite.sum())
        self.count("s_sum", masked_moments(context.require("discriminator"), finite)[1])
        if context.policy_average is not None:
            self.count(
                "centred_s_sum",
                masked_moments(context.require("discriminator") - context.require("policy_average"), finite)[1],
            )
        c = self.reduce_counts()
        self.seen_nonfinite |= c["finite"] < c["tokens"]  # global counts: every rank agrees
        metrics = {
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
            self.tag("frac_neg"): self.share(c["acted_on_neg"], c["neg"]),
            self.tag("s_mean"): self.share(c["s_sum"], c["finite"]),
        }
        if self.symmetric:
            metrics[self.tag("frac_pos")] = self.share(c["acted_on_pos"], c["pos"])
        if self.seen_nonfinite:
            metrics[self.tag("nonfinite_frac")] = self.share(c["tokens"] - c["finite"], c["tokens"])
        if "centred_s_sum" in c:
            metrics[self.tag("centred_s_mean")] = self.share(c["centred_s_sum"], c["finite"])
        self.log_metrics(pl_module, metrics)

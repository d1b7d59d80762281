"""STAPO's S2T (silencing spurious tokens, arXiv 2602.15620) as a keep-mask callback."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.distributed.collectives import all_reduce_sum, global_top_k_cut
from lit_entropy.functional.control import check_s2t_args, interpolated_quantile, s2t_mask
from lit_entropy.internals.lightning import callback_state_key
from lit_entropy.protocol import TokenMaskContext

__all__ = ["SpuriousTokenSilencing", "global_quantile"]


def global_quantile(values: Tensor, mask: Tensor, quantile: float) -> float:
    """``torch.quantile``'s linear-interpolated ``quantile`` of the valid ``values`` of all ranks (two global top-k
    cuts, no gather of the values); NaN without a valid value. Call on every rank."""
    count = int(all_reduce_sum(mask.sum().to(torch.float64)).item())
    if count == 0:
        return math.nan
    k_low, k_high, frac = interpolated_quantile(count, quantile)
    low = global_top_k_cut(values, mask, k_low).threshold
    high = low if k_high == k_low else global_top_k_cut(values, mask, k_high).threshold
    return low + frac * (high - low)


class SpuriousTokenSilencing(TokenCallback):
    """STAPO's S2T: mask the rewarded tokens that are both improbable and confident (arXiv 2602.15620).

    A valid token with ``A > 0``, ``p_old < prob_threshold`` and entropy below the ``entropy_quantile`` of the
    global batch's valid tokens (``torch.quantile``'s linear rule over all ranks) leaves the loss and its
    denominator: the objective is renormalised over the kept tokens, as the paper's. Only the paper is public;
    :mod:`lit_entropy.functional.control.spurious` says which equation this is.

    Quadrants: an improbable token at a confident position has ``p < exp(-H)``, so ``S < 0``: S2T removes the
    tail of ``a_pos_d_neg`` (rewarded unlikely tokens, whose update raises entropy) where the gradient is largest.

    Args:
        prob_threshold: ``tau_p`` (0.002).
        entropy_quantile: the entropy cut as a quantile of the batch (0.8).
        log_prefix: logs ``<prefix>/frac`` (masked share of valid tokens), ``/frac_pos`` (of the A > 0 tokens) and
            ``/entropy_threshold`` (nats).
    """

    required_fields = frozenset({"mask", "advantages", "old_logprobs", "entropy"})

    def __init__(
        self, prob_threshold: float = 0.002, entropy_quantile: float = 0.8, log_prefix: str = "train/s2t"
    ) -> None:
        super().__init__(log_prefix)
        check_s2t_args(prob_threshold, entropy_quantile)
        self.prob_threshold, self.entropy_quantile = float(prob_threshold), float(entropy_quantile)

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, prob_threshold=self.prob_threshold, entropy_quantile=self.entropy_quantile)

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask with the global entropy threshold. Call on every rank."""
        mask, advantages = context.mask, context.require("advantages")
        threshold = global_quantile(context.require("entropy"), mask, self.entropy_quantile)
        keep = mask.clone()
        if math.isfinite(threshold):
            keep = s2t_mask(
                context.require("old_logprobs"), context.require("entropy"), advantages, mask,
                prob_threshold=self.prob_threshold, entropy_quantile=self.entropy_quantile, entropy_threshold=threshold,
            )  # fmt: skip
        pos = mask & (advantages > 0)
        self.count_tokens(mask, ~keep)
        self.count("pos", pos.sum())
        c = self.reduce_counts()
        metrics = {
            self.tag("frac"): self.share(c["acted_on"], c["tokens"]),
            self.tag("frac_pos"): self.share(c["acted_on"], c["pos"]),
        }
        if math.isfinite(threshold):
            metrics[self.tag("entropy_threshold")] = threshold
        self.log_metrics(pl_module, metrics)
        return keep

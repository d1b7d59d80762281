"""Count-matched random masking of negative-advantage tokens: the control for Clip_B."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from typing_extensions import override

from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.functional.checks import check_seed
from lit_entropy.functional.masked import masked_moments
from lit_entropy.functional.selection import check_clip_b_args, clip_b_mask, finite_mask
from lit_entropy.internals.lightning import callback_state_key
from lit_entropy.protocol import TokenMaskContext

__all__ = ["RandomNegativeMasking"]


class RandomNegativeMasking(TokenCallback):
    """Mask as many tokens as Clip_B at ``mu`` would, but chosen uniformly among the A < 0 tokens.

    Separates "Clip_B removes *which* tokens" from "Clip_B removes *some* negative gradient": if a method's
    effect comes from its selection by the entropy discriminator, this control (same count, same sign of
    the advantage, random positions) should not reproduce it. Per rollout batch, Clip_B's count is taken from
    the global statistics of ``S`` (THEORY §3; tokens with a non-finite ``S`` are left out of them, as
    :class:`~lit_entropy.callbacks.EntropyDiscriminatorClipping` leaves them out); each rank then masks,
    among its own A < 0 tokens, as many as Clip_B would mask on that rank, so the global count matches
    exactly. The draw comes from a ``torch.Generator`` seeded with ``seed + global_rank`` and is checkpointed.

    Logged per rollout batch: ``<log_prefix>/frac`` (masked share of valid tokens).

    Args:
        mu: Clip_B threshold whose masked count is matched, a finite number > 0 (paper: 2.5).
        seed: seeds the random choice, an integer in [0, 2**32 - 1].
        log_prefix: prefix of the logged metric name.
    """

    required_fields = frozenset({"mask", "advantages", "discriminator"})

    def __init__(self, mu: float = 2.5, seed: int = 0, log_prefix: str = "train/random_mask") -> None:
        super().__init__(log_prefix)
        check_clip_b_args(mu)  # the count is Clip_B's: its math's own check
        self.mu = float(mu)
        self.seed = check_seed("seed", seed)
        self._generator: torch.Generator | None = None

    @property
    @override
    def state_key(self) -> str:
        return callback_state_key(self, mu=self.mu, seed=self.seed)

    def _rng(self, rank: int) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed + rank)
        return self._generator

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask with Clip_B's count of random A < 0 tokens removed. Must be called on every rank."""
        mask, advantages = context.mask, context.require("advantages")
        moments = all_reduce_sum(
            masked_moments(context.require("discriminator"), finite_mask(context.require("discriminator"), mask))
        )
        clip_keep = clip_b_mask(context.require("discriminator"), advantages, mask, mu=self.mu, moments=moments)
        count = int((mask & ~clip_keep).sum())
        candidates = (mask & (advantages < 0)).flatten().nonzero().squeeze(-1).cpu()
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        chosen = candidates[torch.randperm(candidates.numel(), generator=self._rng(rank))[:count]]
        keep = mask.clone().flatten()
        keep[chosen.to(keep.device)] = False
        keep = keep.view_as(mask)
        self.count_tokens(mask, ~keep)
        counts = self.reduce_counts()
        self.log_metrics(pl_module, {self.tag("frac"): self.share(counts["acted_on"], counts["tokens"])})
        return keep

    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self._generator is not None:
            state["generator"] = self._generator.get_state()
        return state

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        if "generator" in state_dict:
            self._generator = torch.Generator()
            self._generator.set_state(state_dict["generator"])

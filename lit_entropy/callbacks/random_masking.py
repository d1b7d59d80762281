"""Count-matched random masking of negative-advantage tokens: the control for Clip_B."""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.functional.clipping import clip_b_mask
from lit_entropy.functional.masked import masked_moments
from lit_entropy.protocol import TokenMaskContext, check_token_masking_module

__all__ = ["RandomNegativeMasking"]


class RandomNegativeMasking(Callback):
    """Mask as many tokens as Clip_B at ``mu`` would, but chosen uniformly among the A < 0 tokens.

    Separates "Clip_B removes *which* tokens" from "Clip_B removes *some* negative gradient": if a method's
    effect comes from its selection by the entropy discriminator, this control (same count, same sign of
    the advantage, random positions) should not reproduce it. Per rollout batch, Clip_B's count is taken from
    the global statistics of ``S`` (THEORY §3); each rank then masks, among its own A < 0 tokens, as many as
    Clip_B would mask on that rank, so the global count matches exactly. The draw comes from a
    ``torch.Generator`` seeded with ``seed + global_rank`` and is checkpointed.

    Logged per rollout batch: ``<log_prefix>_frac`` (masked share of valid tokens).

    Args:
        mu: Clip_B threshold whose masked count is matched (paper: 2.5).
        seed: seeds the random choice.
        log_prefix: prefix of the logged metric name.
    """

    def __init__(self, mu: float = 2.5, seed: int = 0, log_prefix: str = "train/random_mask") -> None:
        if not mu > 0:
            raise ValueError(f"mu must be > 0, got mu={mu}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got seed={seed!r}")
        self.mu = float(mu)
        self.seed = seed
        self.log_prefix = log_prefix
        self.required_fields = frozenset({"mask", "advantages", "discriminator"})
        self._generator: torch.Generator | None = None
        self.num_tokens = 0
        self.num_masked = 0

    @property
    def state_key(self) -> str:
        return self._generate_state_key(mu=self.mu, seed=self.seed)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_token_masking_module(pl_module, self.required_fields, "RandomNegativeMasking")

    def _rng(self, rank: int) -> torch.Generator:
        if self._generator is None:
            self._generator = torch.Generator().manual_seed(self.seed + rank)
        return self._generator

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Keep mask with Clip_B's count of random A < 0 tokens removed. Must be called on every rank."""
        mask, advantages = context.mask, context.advantages
        moments = all_reduce_sum(masked_moments(context.discriminator, mask))
        clip_keep = clip_b_mask(context.discriminator, advantages, mask, mu=self.mu, moments=moments)
        count = int((mask & ~clip_keep).sum())
        candidates = (mask & (advantages < 0)).flatten().nonzero().squeeze(-1).cpu()
        rank = int(getattr(trainer, "global_rank", 0) or 0)
        chosen = candidates[torch.randperm(candidates.numel(), generator=self._rng(rank))[:count]]
        keep = mask.clone().flatten()
        keep[chosen.to(keep.device)] = False
        keep = keep.view_as(mask)
        n = all_reduce_sum(torch.tensor([float(mask.sum()), float(count)], dtype=torch.float64, device=mask.device))
        self.num_tokens += int(n[0])
        self.num_masked += int(n[1])
        if getattr(pl_module, "_trainer", None) is not None:
            pl_module.log(f"{self.log_prefix}_frac", float(n[1] / n[0].clamp(min=1.0)), on_step=True, batch_size=1)
        return keep

    def state_dict(self) -> dict[str, Any]:
        state = {"num_tokens": self.num_tokens, "num_masked": self.num_masked}
        if self._generator is not None:
            state["generator"] = self._generator.get_state()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.num_tokens = int(state_dict["num_tokens"])
        self.num_masked = int(state_dict["num_masked"])
        if "generator" in state_dict:
            self._generator = torch.Generator()
            self._generator.set_state(state_dict["generator"])

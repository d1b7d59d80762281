"""Fraction of response tokens whose gradient the PPO ratio clip removes."""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import Tensor

from lit_entropy.functional.losses import clipped_token_masks
from lit_entropy.metrics._base import Float64StateMetric, token_mask

__all__ = ["ClipRatio"]


_OUTPUTS = ("low", "high", "total")


class ClipRatio(Float64StateMetric):
    r"""Fractions of valid tokens clipped low, clipped high, and clipped in total by the PPO ratio clip.

    A token is *low-clipped* when ``ratio < 1 - clip_ratio_low`` and its advantage is negative,
    and *high-clipped* when ``ratio > 1 + clip_ratio_high`` and its advantage is positive (the
    counting of TRL, via :func:`lit_entropy.functional.losses.ratio.clipped_token_masks`). The two
    sets are disjoint, so ``total = low + high``. Each fraction is over all valid tokens seen since
    the last ``reset`` (token-weighted), summed across ranks when synced.

    As input to ``forward`` and ``update`` the metric accepts:

    - ``ratio`` (:class:`~torch.Tensor`): importance ratio ``pi / pi_old`` per token, ``[B, T]``.
    - ``advantages`` (:class:`~torch.Tensor`): ``[B, T]`` per token or ``[B]`` per sequence.
    - ``mask`` (:class:`~torch.Tensor`, optional): bool ``[B, T]``, True for real response tokens;
      ``None`` counts every token.

    As output of ``forward`` and ``compute`` the metric returns a dict with float64 scalars under
    ``"low"``, ``"high"`` and ``"total"``, or with ``output="low"``/``"high"``/``"total"`` that one
    float64 scalar; all are NaN when no valid token was seen. Lightning's ``self.log`` and
    ``self.log_dict`` take only metric objects that return a scalar, so log the three fractions as
    three ``output=`` metrics in a :class:`~torchmetrics.MetricCollection`: their states are equal,
    so the collection's compute groups update them once per ``update``::

        self.clip = MetricCollection(
            {name: ClipRatio(0.2, 0.28, output=name) for name in ("low", "high", "total")}, prefix="train/clip/"
        )
        ...
        self.clip.update(ratio, advantages, mask)
        self.log_dict(self.clip)  # train/clip/low, train/clip/high, train/clip/total

    Args:
        clip_ratio_low: lower clip epsilon, ``>= 0`` (ratio floor ``1 - clip_ratio_low``).
        clip_ratio_high: upper clip epsilon, ``>= 0`` (ratio ceiling ``1 + clip_ratio_high``).
        output: ``None`` for the dict of all three fractions, or the one fraction to return:
            ``"low"``, ``"high"`` or ``"total"``.
        kwargs: additional keyword arguments of :class:`~torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> from lit_entropy.metrics import ClipRatio
        >>> metric = ClipRatio(clip_ratio_low=0.2, clip_ratio_high=0.28)
        >>> ratio = torch.tensor([[0.5, 1.5, 1.0, 0.7], [1.3, 0.7, 1.0, 2.0]])
        >>> advantages = torch.tensor([-1.0, 1.0])
        >>> mask = torch.tensor([[True, True, True, False], [True, True, True, True]])
        >>> {name: round(value.item(), 4) for name, value in metric(ratio, advantages, mask).items()}
        {'low': 0.1429, 'high': 0.2857, 'total': 0.4286}
        >>> ClipRatio(clip_ratio_low=0.2, clip_ratio_high=0.28, output="total")(ratio, advantages, mask)
        tensor(0.4286, dtype=torch.float64)
    """

    is_differentiable = False
    # A diagnostic: some clipping is expected, so neither direction is "better".
    higher_is_better = None
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    # A bf16 cast could round two different clip ranges to the same value.
    _float64_states = ("config",)
    _constant_states = ("config",)

    num_low: Tensor
    num_high: Tensor
    num_tokens: Tensor
    config: Tensor

    def __init__(
        self,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        output: Literal["low", "high", "total"] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if output is not None and output not in _OUTPUTS:
            raise ValueError(f"`output` must be None or one of {_OUTPUTS}, got output={output!r}")
        self.output = output
        for name, value in (("clip_ratio_low", clip_ratio_low), ("clip_ratio_high", clip_ratio_high)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"`{name}` must be a float >= 0, got {name}={value!r}")
        self.clip_ratio_low = float(clip_ratio_low)
        self.clip_ratio_high = float(clip_ratio_high)
        # Exact integer counts: they sum across updates and ranks without rounding.
        self.add_state("num_low", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("num_high", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("num_tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        # A state that never changes, holding the clip range: MetricCollection's default compute groups
        # share the states of metrics whose states are equal after the first update (torchmetrics #2596),
        # which would fuse ClipRatio(0.2, 0.2) and ClipRatio(0.2, 0.28) on a first PPO minibatch, where
        # ratio == 1 and nothing is clipped.
        config = torch.tensor([self.clip_ratio_low, self.clip_ratio_high], dtype=torch.float64)
        self.add_state("config", default=config, dist_reduce_fx="max")

    def update(self, ratio: Tensor, advantages: Tensor, mask: Tensor | None = None) -> None:
        """Count the clipped tokens of a batch.

        Args:
            ratio: importance ratio ``[B, T]``.
            advantages: ``[B, T]`` or ``[B]``.
            mask: bool ``[B, T]``; None means every token is valid.

        Raises:
            ValueError: on non-float ``ratio``/``advantages``, a non-bool ``mask`` or mismatched shapes.
        """
        for name, value in (("ratio", ratio), ("advantages", advantages)):
            if not isinstance(value, Tensor) or not value.is_floating_point():
                got = value.dtype if isinstance(value, Tensor) else type(value).__name__
                raise ValueError(f"`{name}` must be a floating-point tensor, got {got}")
        if ratio.ndim != 2:
            raise ValueError(f"`ratio` must be 2-D [B, T], got shape {tuple(ratio.shape)}")
        if advantages.ndim == 1 and advantages.shape[0] == ratio.shape[0]:
            # One advantage per sequence (GRPO): broadcast it over the sequence's tokens.
            advantages = advantages.unsqueeze(-1)
        elif advantages.shape != ratio.shape:
            raise ValueError(
                f"`advantages` must have shape {tuple(ratio.shape)} or {(ratio.shape[0],)}, "
                f"got {tuple(advantages.shape)}"
            )
        mask = token_mask(mask, ratio, "ratio")
        low, high = clipped_token_masks(
            ratio.detach(),
            advantages.detach(),
            clip_ratio_low=self.clip_ratio_low,
            clip_ratio_high=self.clip_ratio_high,
        )
        self.num_low += (low & mask).sum()
        self.num_high += (high & mask).sum()
        self.num_tokens += mask.sum()

    def compute(self) -> dict[str, Tensor] | Tensor:
        """Clipped fractions of valid tokens: all three as a dict, or the ``output`` one (float64; NaN if no token)."""
        num_tokens = self.num_tokens.to(torch.float64)
        values = {
            "low": self.num_low / num_tokens,
            "high": self.num_high / num_tokens,
            "total": (self.num_low + self.num_high) / num_tokens,
        }
        return values if self.output is None else values[self.output]

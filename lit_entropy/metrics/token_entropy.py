"""Token-weighted mean policy entropy over response tokens."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.masked import masked_sum
from lit_entropy.metrics._base import Float64StateMetric, token_mask

__all__ = ["TokenEntropy"]


class TokenEntropy(Float64StateMetric):
    r"""Token-weighted mean of per-token policy entropy (nats) over valid response tokens.

    Every valid token counts once, so long responses weigh more than short ones (the
    ``token-mean`` aggregation); the value is ``sum(H * mask) / sum(mask)`` over everything seen
    since the last ``reset``, summed across ranks when synced.

    As input to ``forward`` and ``update`` the metric accepts:

    - ``entropy`` (:class:`~torch.Tensor`): per-token entropy ``[B, T]`` in nats, any float dtype;
      it is detached and accumulated in float64.
    - ``mask`` (:class:`~torch.Tensor`, optional): bool ``[B, T]``, True for real response tokens;
      ``None`` counts every token. Values under False are ignored even if they are NaN.

    As output of ``forward`` and ``compute`` the metric returns a float64 scalar. With no valid
    token seen it returns NaN, like :class:`~torchmetrics.aggregation.MeanMetric` with zero
    weight: a 0 would read as a collapsed policy, which is exactly what this metric watches for.

    Args:
        kwargs: additional keyword arguments of :class:`~torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> from lit_entropy.metrics import TokenEntropy
        >>> metric = TokenEntropy()
        >>> entropy = torch.tensor([[1.0, 2.0, 9.0], [3.0, 4.0, 5.0]])
        >>> mask = torch.tensor([[True, True, False], [True, True, True]])
        >>> metric(entropy, mask)
        tensor(3., dtype=torch.float64)
        >>> metric.update(torch.tensor([[0.0]]))
        >>> metric.compute()
        tensor(2.5000, dtype=torch.float64)
    """

    is_differentiable = False
    # Entropy is watched for collapse or blow-up, neither direction is "better".
    higher_is_better = None
    full_state_update = False
    plot_lower_bound = 0.0

    _float64_states = ("sum_entropy",)

    sum_entropy: Tensor
    num_tokens: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # float64: bf16/fp32 sums over millions of tokens lose the low digits.
        self.add_state("sum_entropy", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_tokens", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def update(self, entropy: Tensor, mask: Tensor | None = None) -> None:
        """Add the valid tokens of a batch.

        Args:
            entropy: per-token entropy ``[B, T]`` (nats).
            mask: bool ``[B, T]``; None means every token is valid.

        Raises:
            ValueError: on a non-float ``entropy``, a non-bool ``mask`` or mismatched shapes.
        """
        if not isinstance(entropy, Tensor) or not entropy.is_floating_point():
            got = entropy.dtype if isinstance(entropy, Tensor) else type(entropy).__name__
            raise ValueError(f"`entropy` must be a floating-point tensor, got {got}")
        mask = token_mask(mask, entropy, "entropy")
        self.sum_entropy += masked_sum(entropy.detach().to(torch.float64), mask)
        self.num_tokens += mask.sum()

    def compute(self) -> Tensor:
        """Token-weighted mean entropy (float64 scalar; NaN when no valid token was seen)."""
        return self.sum_entropy / self.num_tokens

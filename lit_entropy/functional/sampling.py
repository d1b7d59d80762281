"""Exact categorical sampling from logits by inverse CDF (one ``exp`` pass, a float64 running sum, a binary search).

``torch.multinomial`` costs ~0.2 s per call on one CPU core for 32 rows over Qwen2.5's 151,936-token vocabulary
(measured: ``softmax`` + ``multinomial`` 0.22 s against 0.045 s here), i.e. about half of HF ``generate``'s time
per decode step at that vocabulary. Here a row's unnormalised probabilities ``e = exp(z - max z)`` are summed in
float64 (a float32 running sum near the total resolves only 6e-8, which would round the share of every token
below that), and one uniform draw ``u`` per row picks the first index whose running sum reaches ``u * total``.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CategoricalSampler", "sample_categorical"]


class CategoricalSampler:
    """Draws one token per row of ``scores`` ``[rows, V]`` with probability ``softmax(scores)``.

    Keeps its two ``[rows, V]`` work buffers (float32 exponentials, float64 running sums) between calls: a
    decode loop samples the same shape at every step, and fresh vocabulary-sized temporaries per step fragment
    the CPU heap.
    """

    def __init__(self) -> None:
        self._exp: Tensor | None = None
        self._cumsum: Tensor | None = None

    def _buffers(self, scores: Tensor) -> tuple[Tensor, Tensor]:
        if self._exp is None or self._exp.shape != scores.shape or self._exp.device != scores.device:
            self._exp = torch.empty(scores.shape, dtype=torch.float32, device=scores.device)
            self._cumsum = torch.empty(scores.shape, dtype=torch.float64, device=scores.device)
        return self._exp, self._cumsum

    def __call__(self, scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Token ids ``[rows]`` (int64) sampled from ``softmax(scores)``; ``-inf`` scores are never drawn.

        Raises:
            ValueError: a row has a NaN or ``+inf`` score, or no finite score at all.
        """
        if scores.dim() != 2 or scores.shape[1] == 0:
            raise ValueError(f"scores must be [rows, V] with V > 0, got shape {tuple(scores.shape)}")
        e, c = self._buffers(scores)
        torch.sub(scores, scores.amax(dim=1, keepdim=True), out=e)  # <= 0: exp cannot overflow
        e.exp_()
        torch.cumsum(e, dim=1, dtype=torch.float64, out=c)
        total = c[:, -1:]
        if not bool(torch.isfinite(total).all() and (total > 0).all()):
            bad = (~(torch.isfinite(total) & (total > 0))).squeeze(1).nonzero().flatten().tolist()
            raise ValueError(f"cannot sample: rows {bad} have NaN/+inf scores or no finite score")
        # 1 - U lies in (0, 1]: u > 0 can never select a leading zero-probability token, and u <= total
        # always finds an index (the first one whose running sum reaches u, which has probability > 0).
        u = torch.rand(scores.shape[0], 1, dtype=torch.float64, device=scores.device, generator=generator)
        u = (1.0 - u).mul_(total)
        return torch.searchsorted(c, u).squeeze(1).clamp_(max=scores.shape[1] - 1)


def sample_categorical(scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """One token id per row of ``scores`` ``[rows, V]`` drawn from ``softmax(scores)`` (:class:`CategoricalSampler`).

    Example:
        >>> import torch
        >>> scores = torch.tensor([[0.0, float("-inf"), 0.0], [float("-inf"), 5.0, float("-inf")]])
        >>> ids = sample_categorical(scores, torch.Generator().manual_seed(0))
        >>> ids[0].item() in (0, 2), ids[1].item()
        (True, 1)
    """
    return CategoricalSampler()(scores, generator)

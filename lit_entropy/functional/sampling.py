"""Exact categorical sampling from logits by a two-level inverse CDF (one ``exp`` pass, block sums, one search).

``torch.multinomial`` costs ~0.2 s per call on one CPU core for 32 rows over Qwen2.5's 151,936-token vocabulary
(measured: ``softmax`` + ``multinomial`` 0.22 s), about half of HF ``generate``'s time per decode step at that
vocabulary. Here a row's unnormalised probabilities ``e = exp(z - max z)`` are summed per block of
:data:`SAMPLER_BLOCK` tokens; one uniform draw ``u`` per row first picks the block whose running block sum
reaches ``u * total`` (a float64 cumulative sum over the ~150 block sums), then, inside that block only, the
first token whose float64 running sum reaches the remainder. That is the same token a flat inverse CDF over
the whole row picks (the same order of tokens, the same ``u``), without a float64 running sum over all ``V``
entries, which cost more than the ``exp`` itself (measured, 32 x 151,936, 1 core: flat 0.041 s, two-level
0.015 s per call).

Precision: a float32 running sum near the total would resolve only 6e-8 and round the share of every token
below that to zero; here no token's share is rounded away. The block sums are float32 (relative error ~1e-7
per block, the same order as the float32 ``exp``), and inside a block the running sum is float64. Scores of a
lower precision (bfloat16, float16) are converted to float32 before the maximum is subtracted: subtracting in
bfloat16 rounds ``z - max z`` to 8 significant bits, an error of up to 0.06 in the log-probability.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor

__all__ = ["SAMPLER_BLOCK", "CategoricalSampler", "sample_categorical", "thread_generator"]

#: Tokens per block of the two-level search: ~150 blocks at Qwen2.5's vocabulary keep both levels small.
SAMPLER_BLOCK = 1024

# A per-thread default generator: a rollout worker thread samples from its own stream, not the global one the
# trainer's thread draws from at the same time (whose interleaving would otherwise decide both threads' draws).
_THREAD = threading.local()


@contextmanager
def thread_generator(generator: torch.Generator | None) -> Iterator[None]:
    """Within the block, samplers called without a generator on *this thread* draw from ``generator`` (None: the
    global one). Other threads keep their own default.

    Example:
        >>> import torch
        >>> with thread_generator(torch.Generator().manual_seed(0)):
        ...     a = sample_categorical(torch.zeros(4, 8))
        >>> with thread_generator(torch.Generator().manual_seed(0)):
        ...     b = sample_categorical(torch.zeros(4, 8))
        >>> bool((a == b).all())
        True
    """
    previous = getattr(_THREAD, "generator", None)
    _THREAD.generator = generator
    try:
        yield
    finally:
        _THREAD.generator = previous


class CategoricalSampler:
    """Draws one token per row of ``scores`` ``[rows, V]`` with probability ``softmax(scores)``.

    Keeps its work buffers (float32 exponentials ``[rows, V]`` padded to whole blocks, the block sums) between
    calls: a decode loop samples the same shape at every step, and fresh vocabulary-sized temporaries per step
    fragment the CPU heap.

    Args:
        block: tokens per block of the two-level search (tests use small blocks to exercise the edges).
    """

    def __init__(self, block: int = SAMPLER_BLOCK) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block <= 0:
            raise ValueError(f"block must be a positive int, got {block!r}")
        self.block = block
        self._exp: Tensor | None = None
        self._sums: Tensor | None = None
        self._cum: Tensor | None = None

    def _buffers(self, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        rows, vocab = scores.shape
        blocks = -(-vocab // self.block)
        shape = (rows, blocks * self.block)
        exp, sums, cum = self._exp, self._sums, self._cum
        if exp is None or sums is None or cum is None or exp.shape != shape or exp.device != scores.device:
            # The padding columns past V stay 0 forever: zero mass, never drawn.
            exp = self._exp = torch.zeros(shape, dtype=torch.float32, device=scores.device)
            sums = self._sums = torch.empty(rows, blocks, dtype=torch.float32, device=scores.device)
            cum = self._cum = torch.empty(rows, blocks, dtype=torch.float64, device=scores.device)
        return exp, sums, cum

    def __call__(self, scores: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Token ids ``[rows]`` (int64) sampled from ``softmax(scores)``; ``-inf`` scores are never drawn.

        Raises:
            ValueError: a row has a NaN or ``+inf`` score, or no finite score at all.
        """
        return self.sample(scores, generator)[0]

    def sample(self, scores: Tensor, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
        """Token ids ``[rows]`` (int64) as :meth:`__call__`, and their log-probabilities ``[rows]`` (float32) under
        ``softmax(scores)``: ``z_k - max z - log(sum exp(z - max z))`` from the same float32 exponentials."""
        if scores.dim() != 2 or scores.shape[1] == 0:
            raise ValueError(f"scores must be [rows, V] with V > 0, got shape {tuple(scores.shape)}")
        rows, vocab = scores.shape
        e, sums, cum = self._buffers(scores)
        ev = e[:, :vocab]
        ev.copy_(scores)  # float32 first: the subtraction must not round in bfloat16
        top = ev.amax(dim=1, keepdim=True)
        ev.sub_(top).exp_()  # <= 0 before exp: cannot overflow
        torch.sum(e.view(rows, -1, self.block), dim=2, out=sums)
        torch.cumsum(sums, dim=1, dtype=torch.float64, out=cum)
        total = cum[:, -1:]
        if not bool(torch.isfinite(total).all() and (total > 0).all()):
            bad = (~(torch.isfinite(total) & (total > 0))).squeeze(1).nonzero().flatten().tolist()
            raise ValueError(f"cannot sample: rows {bad} have NaN/+inf scores or no finite score")
        # 1 - U lies in (0, 1]: the first block whose running sum reaches u has positive mass, and the
        # remainder r = u - (running sum before it) lies in (0, that block's sum].
        generator = generator if generator is not None else getattr(_THREAD, "generator", None)
        u = torch.rand(rows, 1, dtype=torch.float64, device=scores.device, generator=generator)
        u = (1.0 - u).mul_(total)
        j = torch.searchsorted(cum, u).clamp_(max=cum.shape[1] - 1)
        before = torch.where(j > 0, cum.gather(1, (j - 1).clamp_(min=0)), 0.0)
        offsets = j * self.block
        inner = torch.cumsum(e.gather(1, offsets + torch.arange(self.block, device=e.device)), 1, dtype=torch.float64)
        # Map the remainder onto the inner float64 running sum (whose end differs from the float32 block sum
        # by rounding), so every token of the block keeps exactly its share e_k / (block sum).
        inner_total = inner[:, -1:]
        r = (u - before).mul_(inner_total / sums.gather(1, j).double()).clamp_(max=inner_total)
        k = torch.searchsorted(inner, r).clamp_(max=self.block - 1)
        ids = offsets + k
        logprobs = (scores.gather(1, ids).double() - top.double() - total.log()).float()
        return ids.squeeze(1), logprobs.squeeze(1)


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

"""Streaming Pass@K and Avg@K over groups of sampled responses (THEORY.md section 4).

Both metrics take whole prompt groups per ``update``: one row of ``correct`` is every sample of
one prompt. The pass@k estimator is non-linear in the number of correct samples, so a prompt's
samples must never be split across updates or ranks (shard prompts, not samples, over ranks).
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.pass_at_k import check_correct, check_counts, check_k, pass_at_k_per_prompt
from lit_entropy.metrics._base import Float64StateMetric

__all__ = ["AvgAtK", "PassAtK"]


def _prompt_counts(
    correct: Tensor | None, num_correct: Tensor | None, num_samples: Tensor | None
) -> tuple[Tensor, Tensor]:
    """Per-prompt ``(c, n)`` as int64 ``[P]`` from a correctness matrix or from ragged counts."""
    if correct is not None:
        if num_correct is not None or num_samples is not None:
            raise ValueError("pass either `correct` or (`num_correct`, `num_samples`), not both")
        correct = check_correct(correct)
        c = correct.sum(dim=1)
        return c, torch.full_like(c, correct.shape[1])
    if num_correct is None or num_samples is None:
        raise ValueError("pass `correct` [P, n], or both `num_correct` [P] and `num_samples` [P]")
    return check_counts(num_correct, num_samples)


class _PromptMean(Float64StateMetric):
    """Mean over prompts of a per-prompt score; float64 ``total`` and int64 ``count`` summed over ranks."""

    is_differentiable = False
    higher_is_better = True
    full_state_update = False
    plot_lower_bound = 0.0
    plot_upper_bound = 1.0
    _float64_states = ("total",)

    total: Tensor
    count: Tensor

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    @abstractmethod
    def _per_prompt(self, num_correct: Tensor, num_samples: Tensor) -> Tensor:
        """Float64 score ``[P]`` of each prompt from its int64 counts ``[P]``."""

    def update(
        self,
        correct: Tensor | None = None,
        *,
        num_correct: Tensor | None = None,
        num_samples: Tensor | None = None,
    ) -> None:
        """Add complete prompt groups.

        Args:
            correct: bool (or 0/1 integer) ``[P, n]``; row ``p`` holds all ``n`` samples of prompt ``p``.
                ``P`` may be 0 (e.g. a rank without prompts).
            num_correct: instead of ``correct``, the number of correct samples per prompt, integer ``[P]``.
            num_samples: with ``num_correct``, the number of samples per prompt, integer ``[P]``
                (prompts may differ).

        Raises:
            ValueError: on bad shapes, dtypes or counts (see the functional checks).
        """
        c, n = _prompt_counts(correct, num_correct, num_samples)
        scores = self._per_prompt(c, n)
        self.total += scores.sum()
        self.count += scores.numel()

    def compute(self) -> Tensor:
        """Mean over all prompts seen (float64 scalar; NaN when no prompt was seen)."""
        return self.total / self.count


class PassAtK(_PromptMean):
    r"""Unbiased pass@k, ``1 - C(n - c, k) / C(n, k)`` per prompt, averaged over prompts.

    As input to ``forward`` and ``update`` the metric accepts either

    - ``correct`` (:class:`~torch.Tensor`): bool ``[P, n]`` with ``n >= k``, one complete prompt
      group per row, or
    - keyword-only ``num_correct`` and ``num_samples`` (:class:`~torch.Tensor`): integer ``[P]``
      per-prompt counts, for groups of different sizes (every ``num_samples >= k``).

    Never split one prompt's samples across updates or ranks: the estimator is non-linear in the
    number of correct samples, so partial groups give a biased value.

    As output of ``forward`` and ``compute`` the metric returns a float64 scalar (NaN when no
    prompt was seen).

    Args:
        k: number of attempts, ``>= 1``.
        kwargs: additional keyword arguments of :class:`~torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> from lit_entropy.metrics import PassAtK
        >>> metric = PassAtK(k=2)
        >>> metric.update(torch.tensor([[True, False, False, False], [False, False, False, False]]))
        >>> metric.update(num_correct=torch.tensor([1]), num_samples=torch.tensor([5]))
        >>> metric.compute()
        tensor(0.3000, dtype=torch.float64)
    """

    config: Tensor
    _constant_states = ("config",)

    def __init__(self, k: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.k = check_k(k)
        # A state that never changes, holding k: MetricCollection's default compute groups share the
        # states of metrics whose states are equal after the first update (torchmetrics #2596, #2916),
        # which would fuse PassAtK(1) and PassAtK(8) whenever the first batch is all wrong.
        self.add_state("config", default=torch.tensor(self.k), dist_reduce_fx="max")

    def _per_prompt(self, num_correct: Tensor, num_samples: Tensor) -> Tensor:
        return pass_at_k_per_prompt(num_correct, num_samples, self.k)


class AvgAtK(_PromptMean):
    r"""Avg@K: the mean over prompts of the fraction ``c / n`` of correct samples (equals pass@1).

    As input to ``forward`` and ``update`` the metric accepts either

    - ``correct`` (:class:`~torch.Tensor`): bool ``[P, n]``, one complete prompt group per row
      (``n = K`` samples), or
    - keyword-only ``num_correct`` and ``num_samples`` (:class:`~torch.Tensor`): integer ``[P]``
      per-prompt counts, for groups of different sizes.

    Each prompt weighs the same whatever its ``n``, so keep a prompt's samples in one update.

    As output of ``forward`` and ``compute`` the metric returns a float64 scalar (NaN when no
    prompt was seen).

    Args:
        kwargs: additional keyword arguments of :class:`~torchmetrics.Metric`.

    Example:
        >>> import torch
        >>> from lit_entropy.metrics import AvgAtK
        >>> metric = AvgAtK()
        >>> metric(torch.tensor([[True, False, False, False], [True, True, False, True]]))
        tensor(0.5000, dtype=torch.float64)
        >>> metric.update(torch.tensor([[True, True, True, True]]))
        >>> metric.compute()
        tensor(0.6667, dtype=torch.float64)
    """

    def _per_prompt(self, num_correct: Tensor, num_samples: Tensor) -> Tensor:
        if (num_samples < 1).any():
            raise ValueError(f"Avg@K needs n >= 1 samples per prompt, got n={int(num_samples.min())}")
        return num_correct.to(torch.float64) / num_samples

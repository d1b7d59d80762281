"""Unbiased Pass@K and Avg@K over groups of sampled responses (THEORY.md section 4).

A prompt with ``n`` samples of which ``c`` are correct has the unbiased estimate
``pass@k = 1 - C(n - c, k) / C(n, k)`` (1 when ``n - c < k``) of the chance that at least one of
``k`` samples is correct. It is computed in float64 as ``1 - prod_{i=n-c+1..n} (1 - k / i)``,
the product form of the Codex paper, which never forms huge binomial coefficients.
Avg@K is the mean fraction of correct samples, ``c / n``; it equals pass@1.

Every function here needs complete prompt groups: the estimator is non-linear in ``c``, so one
prompt's samples must never be split between calls.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

__all__ = ["avg_at_k", "check_correct", "check_counts", "check_k", "pass_at_k", "pass_at_k_per_prompt"]


def check_k(k: object) -> int:
    """Return ``k`` as an int, or raise ValueError unless it is an integer >= 1."""
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k < 1:
        raise ValueError(f"`k` must be an integer >= 1, got k={k!r}")
    return int(k)


def check_correct(correct: Tensor) -> Tensor:
    """Validate a ``[num_prompts, n]`` correctness matrix and return it as bool.

    Integer tensors holding only 0 and 1 are accepted as well as bool tensors.
    """
    if not isinstance(correct, Tensor):
        raise ValueError(f"`correct` must be a torch.Tensor, got {type(correct).__name__}")
    if correct.ndim != 2:
        raise ValueError(f"`correct` must be 2-D [num_prompts, n], got shape {tuple(correct.shape)}")
    if correct.dtype == torch.bool:
        return correct
    if correct.is_floating_point() or correct.is_complex():
        raise ValueError(f"`correct` must be a bool (or 0/1 integer) tensor, got dtype {correct.dtype}")
    if ((correct != 0) & (correct != 1)).any():
        raise ValueError("`correct` integer tensor must hold only 0 and 1")
    return correct.bool()


def check_counts(num_correct: Tensor, num_samples: Tensor) -> tuple[Tensor, Tensor]:
    """Validate per-prompt counts ``[P]`` and return them as int64."""
    for name, value in (("num_correct", num_correct), ("num_samples", num_samples)):
        if not isinstance(value, Tensor):
            raise ValueError(f"`{name}` must be a torch.Tensor, got {type(value).__name__}")
        if value.dtype == torch.bool or value.is_floating_point() or value.is_complex():
            raise ValueError(f"`{name}` must be an integer tensor, got dtype {value.dtype}")
        if value.ndim != 1:
            raise ValueError(f"`{name}` must be 1-D [num_prompts], got shape {tuple(value.shape)}")
    if num_correct.shape != num_samples.shape:
        raise ValueError(
            f"`num_correct` shape {tuple(num_correct.shape)} != `num_samples` shape {tuple(num_samples.shape)}"
        )
    c, n = num_correct.long(), num_samples.long()
    if (c < 0).any() or (c > n).any():
        bad = int(torch.nonzero((c < 0) | (c > n))[0, 0])
        raise ValueError(
            f"`num_correct` must lie in [0, num_samples]; prompt {bad} has num_correct={int(c[bad])}, "
            f"num_samples={int(n[bad])}"
        )
    return c, n


def pass_at_k_per_prompt(num_correct: Tensor, num_samples: Tensor, k: int) -> Tensor:
    """Per-prompt unbiased pass@k for prompts that may have different numbers of samples.

    Args:
        num_correct: number of correct samples per prompt, integer ``[P]``.
        num_samples: number of samples per prompt ``n``, integer ``[P]``; every entry must be ``>= k``.
        k: number of attempts, ``>= 1``.

    Returns:
        float64 tensor ``[P]`` of estimates in ``[0, 1]`` (empty when ``P == 0``).

    Raises:
        ValueError: if ``k < 1``, any ``num_samples < k``, counts out of range, or bad shapes/dtypes.

    Example:
        >>> import torch
        >>> pass_at_k_per_prompt(torch.tensor([0, 1, 2, 4]), torch.tensor([4, 4, 4, 5]), k=2)
        tensor([0.0000, 0.5000, 0.8333, 1.0000], dtype=torch.float64)
    """
    k = check_k(k)
    c, n = check_counts(num_correct, num_samples)
    if (n < k).any():
        raise ValueError(f"pass@k needs n >= k samples per prompt, got k={k} and n={int(n.min())}")
    if c.numel() == 0:
        return torch.zeros(0, dtype=torch.float64, device=c.device)
    # Factor j of prompt p is (1 - k / i) with i = n - c + 1 + j for j < c; padded factors are 1,
    # so one [P, max c] product handles ragged groups without a Python loop.
    j = torch.arange(int(c.max()), device=c.device)
    i = (n - c + 1).unsqueeze(1) + j
    factors = torch.where(j < c.unsqueeze(1), 1.0 - k / i.to(torch.float64), 1.0)
    estimate = 1.0 - factors.prod(dim=1)
    # When n - c < k every k-subset holds a correct sample. The product already hits an exact 0
    # factor (i == k) there; the explicit branch keeps the value exactly 1 and states the rule.
    return torch.where(n - c < k, 1.0, estimate)


def pass_at_k(correct: Tensor, k: int) -> Tensor:
    """Unbiased pass@k averaged over prompts.

    Args:
        correct: bool ``[num_prompts, n]``, True where a sample is correct; each row is one
            complete prompt group of ``n`` samples.
        k: number of attempts, ``1 <= k <= n``.

    Returns:
        float64 scalar: mean over prompts of ``1 - C(n - c, k) / C(n, k)``.

    Raises:
        ValueError: if ``correct`` is not 2-D bool/0-1, has no prompts, or ``k`` is outside ``[1, n]``.

    Example:
        >>> import torch
        >>> correct = torch.tensor([[True, False, False, False], [False, False, False, False]])
        >>> pass_at_k(correct, k=2)
        tensor(0.2500, dtype=torch.float64)
    """
    k = check_k(k)
    correct = check_correct(correct)
    num_prompts, n = correct.shape
    if k > n:
        raise ValueError(f"pass@k needs k <= n, got k={k} and n={n}")
    if num_prompts == 0:
        raise ValueError("`correct` has no prompts (shape [0, n]); pass@k of nothing is undefined")
    num_correct = correct.sum(dim=1)
    num_samples = torch.full_like(num_correct, n)
    return pass_at_k_per_prompt(num_correct, num_samples, k).mean()


def avg_at_k(correct: Tensor) -> Tensor:
    """Avg@K: mean over prompts of the fraction of correct samples ``c / n`` (equals pass@1).

    Args:
        correct: bool ``[num_prompts, n]`` with ``n = K`` samples per prompt.

    Returns:
        float64 scalar in ``[0, 1]``.

    Raises:
        ValueError: if ``correct`` is not 2-D bool/0-1 or has no prompts or no samples.

    Example:
        >>> import torch
        >>> avg_at_k(torch.tensor([[True, False, False, False], [True, True, False, True]]))
        tensor(0.5000, dtype=torch.float64)
    """
    correct = check_correct(correct)
    num_prompts, n = correct.shape
    if num_prompts == 0 or n == 0:
        raise ValueError(f"`correct` must have at least one prompt and one sample, got shape {tuple(correct.shape)}")
    return correct.sum(dim=1, dtype=torch.float64).div(n).mean()

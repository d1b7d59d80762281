"""Advantage reweighting by the token's probability (arXiv 2505.12929, AR of "AR-Lopti").

Source: the authors' code, GitHub zhyang2226/AR-Lopti, ``verl/trainer/ppo/ray_trainer.py``
(``compute_reweight_advantage``, method ``both_linear_normal`` with ``reweight_k = alpha = 0.2``,
``reweight_tau = 1 - alpha = 0.8`` and ``neg_adv_weight = 1.0`` in ``scripts/train_kklogic_AR_4x80GB.sh``):

    A' = (alpha p_old + 1 - alpha) A,    and A' <- neg_weight A' where A <= 0.

Low-probability tokens get a smaller share of their sequence's advantage than likely ones, for both signs.
"""

from __future__ import annotations

from torch import Tensor

from lit_entropy.functional.checks import check_number

__all__ = ["check_reweighting_args", "reweighted_advantages"]


def check_reweighting_args(alpha: float, negative_weight: float) -> None:
    """Raise a ValueError naming the first bad argument, its value and what is allowed."""
    check_number("alpha", alpha, low=0, high=1)
    check_number("negative_weight", negative_weight, low=0)


def reweighted_advantages(
    advantages: Tensor, logprobs: Tensor, mask: Tensor, *, alpha: float = 0.2, negative_weight: float = 1.0
) -> Tensor:
    """``(alpha p + 1 - alpha) A`` per token, times ``negative_weight`` where ``A <= 0``; 0 outside ``mask``.

    Args:
        advantages: ``[B, T]``.
        logprobs: ``[B, T]`` rollout log-probs of the sampled tokens (``p = exp``).
        mask: ``[B, T]`` bool, valid tokens.
        alpha: weight of the probability, in [0, 1] (0 = no reweighting).
        negative_weight: extra factor on non-positive advantages (the authors' ``neg_adv_weight``).
    """
    check_reweighting_args(alpha, negative_weight)
    scale = alpha * logprobs.detach().to(advantages.dtype).exp() + (1.0 - alpha)
    shaped = scale * advantages
    shaped = shaped.where(advantages > 0, shaped * negative_weight)
    return shaped.masked_fill(~mask, 0.0)

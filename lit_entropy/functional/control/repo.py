"""REPO-R: a centred log-probability correction of the advantage with an adaptive strength (arXiv 2603.11682).

Only the paper is public ("Entropy-Preserving Reinforcement Learning", its REPO family, the regulated variant
REPO-R). Implemented, per token with rollout log-prob ``log p`` and entropy ``H`` at its position:

    A' = A - zeta |A| (log p + H)

``log p + H`` is the token's log-prob centred by its expectation under the policy (``E_{k~p}[log p_k] = -H``)
and has the sign of the discriminator ``S = p (H + log p)``: the correction lowers the advantage of likely tokens
and raises that of unlikely ones, whatever the sign of A, so every update leans toward raising the entropy,
in proportion to ``|A|``. Once per batch, ``zeta`` is doubled while the batch's token-mean entropy is below its
value at the first batch, halved while above it (unchanged when equal), clamped to ``[zeta_min, zeta_max]``.

The paper does not publish the initial ``zeta``. lit_entropy takes ``zeta_0 = 0.05``: the correction is then a
few percent of ``|A|`` for typical tokens (``|log p + H|`` of order 1 nat), small next to the reward signal at
the start, and the doubling reaches any needed strength within a few batches (0.05 -> 0.8 in 4). ``zeta_max = 1``
keeps the correction from reversing the sign of the advantage of a token with ``|log p + H| < 1``.
"""

from __future__ import annotations

from torch import Tensor

from lit_entropy.functional.checks import check_number

__all__ = ["check_repo_r_args", "repo_r_advantages", "repo_r_zeta"]


def check_repo_r_args(zeta: float, zeta_min: float, zeta_max: float) -> None:
    """Raise a ValueError naming the first bad REPO-R argument, its value and what is allowed."""
    check_number("zeta_min", zeta_min, low=0)
    check_number("zeta_max", zeta_max, low=zeta_min)
    check_number("zeta", zeta, low=zeta_min, high=zeta_max)


def repo_r_zeta(
    zeta: float, batch_entropy: float, initial_entropy: float, *, zeta_min: float = 1e-4, zeta_max: float = 1.0
) -> float:
    """The next ``zeta``: doubled below the initial entropy, halved above it, clamped to ``[zeta_min, zeta_max]``."""
    if batch_entropy < initial_entropy:
        zeta = 2.0 * zeta
    elif batch_entropy > initial_entropy:
        zeta = 0.5 * zeta
    return min(max(zeta, zeta_min), zeta_max)


def repo_r_advantages(advantages: Tensor, logprobs: Tensor, entropy: Tensor, mask: Tensor, *, zeta: float) -> Tensor:
    """``A - zeta |A| (log p + H)`` per token ``[B, T]``, 0 outside ``mask``.

    Args:
        advantages: ``[B, T]``.
        logprobs: ``[B, T]`` rollout log-probs of the sampled tokens.
        entropy: ``[B, T]`` entropy in nats at each position.
        mask: ``[B, T]`` bool, valid tokens.
        zeta: the correction's strength (>= 0).
    """
    check_number("zeta", zeta, low=0)
    centred = logprobs.detach().to(advantages.dtype) + entropy.detach().to(advantages.dtype)
    return (advantages - zeta * advantages.abs() * centred).masked_fill(~mask, 0.0)

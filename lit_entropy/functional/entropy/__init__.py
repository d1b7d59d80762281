"""Token entropy and its dynamics (THEORY.md sections 1-2), from logits or straight from hidden states and the
LM head, and the adaptive entropy bonus.

:mod:`.logits` (entropy statistics of materialised logits, chunked), :mod:`.linear` (the same statistics from
``(hidden, W, b)`` without the logits), :mod:`.linear_loss` (a per-token loss of them with its gradient in the
same pass), :mod:`.blocks` (the blockwise log-sum-exp those two share), :mod:`.numerics` (floor and checks shared
by all kernels), :mod:`.bonus` (the adaptive entropy-bonus rule). The kernels' shared helpers (:mod:`.blocks`,
:mod:`.numerics`) are public in their modules and not re-exported here.
"""

from lit_entropy.functional.entropy.bonus import adaptive_entropy_coef, check_adaptive_entropy_args
from lit_entropy.functional.entropy.linear import DEFAULT_BLOCK, linear_entropy_stats
from lit_entropy.functional.entropy.linear_loss import LOSS_BLOCK, linear_entropy_loss
from lit_entropy.functional.entropy.logits import (
    DEFAULT_CHUNK_BYTES,
    EntropyStats,
    default_chunk_rows,
    entropy_discriminator,
    entropy_from_logits,
    entropy_stats,
    predicted_entropy_change,
)

__all__ = [
    "DEFAULT_BLOCK",
    "DEFAULT_CHUNK_BYTES",
    "EntropyStats",
    "LOSS_BLOCK",
    "adaptive_entropy_coef",
    "check_adaptive_entropy_args",
    "default_chunk_rows",
    "entropy_discriminator",
    "entropy_from_logits",
    "entropy_stats",
    "linear_entropy_loss",
    "linear_entropy_stats",
    "predicted_entropy_change",
]

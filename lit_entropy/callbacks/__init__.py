"""Lightning callbacks of lit_entropy: token-mask / penalty providers and entropy diagnostics.

Every provider here implements :mod:`lit_entropy.protocol`; several compose (keep masks by AND,
penalties by sum), and each logs the share of tokens it acted on under its own prefix.
"""

from lit_entropy.callbacks.dynamics_monitor import EntropyDynamicsMonitor
from lit_entropy.callbacks.entropy_clipping import EntropyDiscriminatorClipping
from lit_entropy.callbacks.entropy_control import AdaptiveEntropyBonus, ClipCov, HighEntropySelection, KLCov
from lit_entropy.callbacks.random_masking import RandomNegativeMasking

__all__ = [
    "AdaptiveEntropyBonus",
    "ClipCov",
    "EntropyDiscriminatorClipping",
    "EntropyDynamicsMonitor",
    "HighEntropySelection",
    "KLCov",
    "RandomNegativeMasking",
]

"""Lightning callbacks of lit_entropy: token-mask / penalty providers and entropy diagnostics.

Every provider here implements :mod:`lit_entropy.protocol` on the one base
:class:`~lit_entropy.callbacks.base.TokenCallback`; several compose (keep masks by AND, penalties by
sum), and each logs the share of tokens it acted on as ``<prefix>/frac``.
"""

from lit_entropy.callbacks.base import TokenCallback
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
    "TokenCallback",
]

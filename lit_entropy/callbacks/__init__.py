"""Lightning callbacks of lit_entropy: token-mask / penalty providers and entropy diagnostics.

Every provider here implements :mod:`lit_entropy.protocol` on the one base
:class:`~lit_entropy.callbacks.base.TokenCallback`; several compose (keep masks by AND, penalties by
sum, advantage providers in callback order), and each logs the share of tokens it acted on as ``<prefix>/frac``.
"""

from lit_entropy.callbacks.advantage_shaping import REPOR, STARE, AdvantageReweighting, Entrocraft, UnlikelinessReward
from lit_entropy.callbacks.base import TokenCallback
from lit_entropy.callbacks.dynamics_monitor import EntropyDynamicsMonitor
from lit_entropy.callbacks.entropy_clipping import EntropyDiscriminatorClipping
from lit_entropy.callbacks.entropy_control import AdaptiveEntropyBonus, ClipCov, HighEntropySelection, KLCov
from lit_entropy.callbacks.random_masking import RandomNegativeMasking
from lit_entropy.callbacks.spurious_tokens import SpuriousTokenSilencing

__all__ = [
    "REPOR",
    "STARE",
    "AdaptiveEntropyBonus",
    "AdvantageReweighting",
    "ClipCov",
    "EntropyDiscriminatorClipping",
    "EntropyDynamicsMonitor",
    "Entrocraft",
    "HighEntropySelection",
    "KLCov",
    "RandomNegativeMasking",
    "SpuriousTokenSilencing",
    "TokenCallback",
    "UnlikelinessReward",
]

"""lit_entropy: Lightning-native reinforcement fine-tuning of LLMs built around entropy dynamics.

Heavy members (the LightningModule, the datamodule) load lazily, so that
``lit_entropy.protocol`` and ``lit_entropy.functional`` import without transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_LAZY = {
    "RFTModule": "lit_entropy.module",
    "PromptDataModule": "lit_entropy.data.datamodule",
    "EntropyDiscriminatorClipping": "lit_entropy.callbacks",
}

__all__ = ["EntropyDiscriminatorClipping", "PromptDataModule", "RFTModule", "__version__"]


def _silence_known_noise() -> None:
    # Lightning's cloud-product tip and a torch deprecation inside Lightning 2.6 reach every script that uses
    # lit_entropy's callbacks and metrics with its own Trainer; nothing there for the user to act on
    # (lit_entropy.internals.noise lists each message and why). Logging filters and warning filters only.
    from lit_entropy.internals.noise import silence_known_noise

    silence_known_noise()


_silence_known_noise()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_entropy' has no attribute {name!r}")

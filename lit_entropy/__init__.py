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


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_entropy' has no attribute {name!r}")

"""Datasets and tokenizers: the prompt DataModule and the pieces it composes (``reading``, ``rendering``,
``tokenizing``, ``arguments``), the embedded tasks and the character tokenizer.

Members that need transformers, datasets or Lightning load lazily, so that the embedded task
(``lit_entropy.data.arithmetic``) imports without them.
"""

from __future__ import annotations

import importlib
from typing import Any

from lit_entropy.data.arithmetic import ARITHMETIC_ALPHABET, make_arithmetic_examples

_LAZY = {
    "ARITHMETIC_DATASET": "lit_entropy.data.reading",
    "PromptCollator": "lit_entropy.data.datamodule",
    "PromptDataModule": "lit_entropy.data.datamodule",
    "PromptDataset": "lit_entropy.data.datamodule",
    "build_char_tokenizer": "lit_entropy.data.char_tokenizer",
}

__all__ = [
    "ARITHMETIC_ALPHABET",
    "ARITHMETIC_DATASET",
    "PromptCollator",
    "PromptDataModule",
    "PromptDataset",
    "build_char_tokenizer",
    "make_arithmetic_examples",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_entropy.data' has no attribute {name!r}")

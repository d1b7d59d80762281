"""Load a module of the ``scripts`` package afresh (the repository root is on pytest's pythonpath)."""

from __future__ import annotations

import importlib
from types import ModuleType


def load_script(name: str) -> ModuleType:
    """Import ``name`` (``"scripts.bench.step"``) and execute it anew, so module-level state starts clean in each
    test."""
    return importlib.reload(importlib.import_module(name))

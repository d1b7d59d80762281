"""The ``lit-entropy`` command: LightningCLI over :class:`~lit_entropy.module.RFTModule` and
:class:`~lit_entropy.data.PromptDataModule`, plus ``export``.

Importing this package loads no Lightning (``lit-entropy --help`` answers at once); the members below load
on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from lit_entropy.cli.commands import main
from lit_entropy.cli.errors import SettingsError

_LAZY = {"RFTCLI": "lit_entropy.cli.app", "cli_main": "lit_entropy.cli.app", "export_main": "lit_entropy.cli.export"}

__all__ = ["RFTCLI", "SettingsError", "cli_main", "export_main", "main"]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_entropy.cli' has no attribute {name!r}")

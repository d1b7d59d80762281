"""The ``lit-entropy`` command: LightningCLI over :class:`~lit_entropy.module.RFTModule` and
:class:`~lit_entropy.data.PromptDataModule`, plus ``export``."""

from lit_entropy.cli.app import RFTCLI, cli_main, main
from lit_entropy.cli.errors import SettingsError
from lit_entropy.cli.export import export_main

__all__ = ["RFTCLI", "SettingsError", "cli_main", "export_main", "main"]

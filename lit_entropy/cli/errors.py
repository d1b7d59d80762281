"""The one error type the command line prints as a single line."""

from __future__ import annotations

__all__ = ["SettingsError"]


class SettingsError(ValueError):
    """A bad setting or a refused action found before training; ``main`` prints it as one line."""

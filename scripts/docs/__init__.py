"""Generators of documentation blocks and figures, each run as ``python -m scripts.docs.<name>``."""

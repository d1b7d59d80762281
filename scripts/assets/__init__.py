"""Builders of the library's embedded assets, each run as ``python -m scripts.assets.<name>``."""

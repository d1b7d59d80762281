"""transformers (5.x) private model attributes lit_entropy reads or sets. Pinned by
``tests/internals/test_transformers.py``."""

from __future__ import annotations

from typing import Any

__all__ = ["attention_implementation", "decoder_layer_class_names", "mark_fsdp_managed"]


def decoder_layer_class_names(model: Any) -> set[str]:
    """Class names of a Hugging Face model's transformer blocks (``model._no_split_modules``), empty if none."""
    return set(getattr(model, "_no_split_modules", None) or [])


def mark_fsdp_managed(model: Any) -> None:
    """Mark a model sharded with ``fully_shard`` as FSDP-managed, as transformers' own FSDP2 path does.

    ``generate`` then defaults to ``synced_gpus=True``: ranks whose completions finish early keep running
    forward passes, so the per-layer all-gathers stay matched across ranks.
    """
    model._is_fsdp_managed_module = True


def attention_implementation(model: Any) -> str | None:
    """The attention implementation a Hugging Face model runs (``config._attn_implementation``: ``sdpa``,
    ``eager``, ``flash_attention_2``, ...), None when it has no config."""
    config = getattr(model, "config", None)
    return getattr(config, "_attn_implementation", None)

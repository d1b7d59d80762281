"""Tiny tied-head Qwen2 models over a small tokenizer: the embedded default's architecture, test and study models."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

__all__ = ["build_qwen2", "save_tiny_model"]


def build_qwen2(
    tokenizer: Any,
    *,
    hidden_size: int = 32,
    intermediate_size: int | None = None,
    num_layers: int = 1,
    num_heads: int = 2,
    num_kv_heads: int = 1,
    seed: int = 0,
    max_new_tokens: int | None = None,
    max_position_embeddings: int | None = None,
) -> Any:
    """A randomly initialised tied-head ``Qwen2ForCausalLM`` over ``tokenizer`` whose generation config samples
    plainly at T = 1 (no top-k / top-p).

    Args:
        tokenizer: a Hugging Face tokenizer (its size, pad / bos / eos ids and ``model_max_length`` are used).
        hidden_size: model width; ``head_dim = hidden_size / num_heads`` (vLLM serves head_dim 64, not 16).
        intermediate_size: MLP width; None = ``2 * hidden_size``.
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention).
        seed: ``torch.manual_seed`` before the weights are drawn.
        max_new_tokens: the generation config's length limit (None: unset).
        max_position_embeddings: context length; None = ``tokenizer.model_max_length``.
    """
    # deferred: the Qwen2 model code takes ~1 s to import (on top of transformers); only building a model needs it
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    # transformers' typed Qwen2Config signature omits head_dim, which the config still takes and stores (kwargs).
    config = Qwen2Config(  # type: ignore[call-arg]
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=hidden_size // num_heads,
        max_position_embeddings=max_position_embeddings or tokenizer.model_max_length,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
    )
    return model


def save_tiny_model(path: str | Path, tokenizer: Any, **kwargs: Any) -> Path:
    """:func:`build_qwen2` over ``tokenizer`` (keyword arguments) saved with it as a ``save_pretrained`` directory.

    Args:
        path: the directory to write.
        tokenizer: the model's tokenizer (the embedded task's: ``lit_entropy.data.build_char_tokenizer()``).
        **kwargs: :func:`build_qwen2`'s.
    """
    build_qwen2(tokenizer, **kwargs).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Path(path)

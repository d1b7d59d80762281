"""Shared fixtures: a tiny random Qwen2 model with the char-level tokenizer, saved to disk."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Every test ends with the thread count it started with: scripts' ``main`` and Lightning's CPU strategies call
    ``torch.set_num_threads``, and BLAS results (hence bit-exact resume comparisons) depend on the thread count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def build_tiny_model_dir(path, *, hidden_size: int = 32, layers: int = 1, head_dim: int = 16, seed: int = 0):
    """Save a random tiny Qwen2 causal LM plus the arithmetic char tokenizer into ``path``."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from lit_entropy.data.char_tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=head_dim,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return str(build_tiny_model_dir(tmp_path_factory.mktemp("tiny_qwen2")))

"""Shared fixtures: a tiny random Qwen2 model with the char-level tokenizer, saved to disk."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.models.tiny import save_tiny_model


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    """Every test ends with the thread count it started with: scripts' ``main`` and Lightning's CPU strategies call
    ``torch.set_num_threads``, and BLAS results (hence bit-exact resume comparisons) depend on the thread count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2")))

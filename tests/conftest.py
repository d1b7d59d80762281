"""Shared fixtures: a tiny random Qwen2 model with the char-level tokenizer saved to disk, the CLI's settings."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
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
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), build_char_tokenizer()))


@pytest.fixture(scope="session")
def accepted_settings() -> tuple[set[str], set[str]]:
    """(every dotted setting the CLI accepts, the class_path settings whose init_args are free-form)."""
    from lit_entropy.cli import cli_main
    from lit_entropy.cli.parse_errors import setting_keys
    from lit_entropy.internals.cli import parser_settings

    parser = cli_main(["--trainer.logger=false"], run=False).parser
    class_paths = {
        option[2:].removesuffix(".help")
        for setting in parser_settings(parser)
        for option in setting.options
        if option.endswith(".help") and option != "--help"
    }
    return set(setting_keys(parser)), class_paths

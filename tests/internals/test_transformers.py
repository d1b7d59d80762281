"""Pins lit_entropy.internals.transformers (and the public tied-weights map export reads) on a tiny Qwen2."""

from __future__ import annotations

import pytest
import transformers

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.internals.transformers import decoder_layer_class_names, mark_fsdp_managed
from lit_entropy.models.tiny import build_qwen2

UPGRADE = f"(transformers {transformers.__version__}): update lit_entropy/internals/transformers.py"


@pytest.fixture(scope="module")
def model():
    return build_qwen2(build_char_tokenizer(), num_layers=2)


def test_decoder_layer_class_names_name_the_blocks(model) -> None:
    names = decoder_layer_class_names(model)
    assert names == {"Qwen2DecoderLayer"}, f"_no_split_modules of Qwen2 {UPGRADE}"
    assert sum(type(m).__name__ in names for m in model.modules()) == 2
    assert decoder_layer_class_names(object()) == set()


def test_generate_sees_the_fsdp_mark(model) -> None:
    from transformers.distributed.fsdp import is_fsdp_managed_module

    assert not is_fsdp_managed_module(model)
    mark_fsdp_managed(model)
    try:
        assert is_fsdp_managed_module(model), f"generate no longer reads the FSDP2 mark {UPGRADE}"
    finally:
        del model._is_fsdp_managed_module


def test_tied_weights_map_export_drops(model) -> None:
    assert model.all_tied_weights_keys == {"lm_head.weight": "model.embed_tokens.weight"}, (
        f"PreTrainedModel.all_tied_weights_keys (read by models.export) {UPGRADE}"
    )

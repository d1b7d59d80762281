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


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_packed_rows_without_a_mask_attend_within_their_row(attention) -> None:
    """``step.packing`` relies on transformers building the block-diagonal mask from restarting position ids."""
    import torch

    from lit_entropy.internals.transformers import attention_implementation

    torch.manual_seed(0)
    model = build_qwen2(build_char_tokenizer(), num_layers=2).double()
    model.set_attn_implementation(attention)
    assert attention_implementation(model) == attention, f"config._attn_implementation {UPGRADE}"
    rows = [torch.randint(3, model.config.vocab_size, (n,)) for n in (5, 9, 3)]
    separate = torch.cat([model(input_ids=r[None], use_cache=False).logits[0] for r in rows])
    positions = torch.cat([torch.arange(len(r)) for r in rows])[None]
    packed = model(input_ids=torch.cat(rows)[None], position_ids=positions, attention_mask=None, use_cache=False)
    torch.testing.assert_close(packed.logits[0], separate, rtol=1e-6, atol=1e-6, msg=f"packed sequences {UPGRADE}")

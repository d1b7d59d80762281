"""Tests of lit_entropy.models.hidden_states against the model's own logits (a tiny random Qwen2)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lit_entropy.functional import entropy_stats, linear_entropy_stats
from lit_entropy.models.hidden_states import lm_head_params, response_hidden_states


def _tiny_qwen2(tie: bool = True, **extra):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=41,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        max_position_embeddings=64,
        tie_word_embeddings=tie,
        **extra,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).double().eval()


def _batch(response_len: int = 5):
    gen = torch.Generator().manual_seed(1)
    sequences = torch.randint(1, 41, (3, 11), generator=gen)
    attention_mask = torch.ones_like(sequences)
    attention_mask[1, :3] = 0  # left padding of the prompt
    attention_mask[2, :6] = 0
    return sequences, attention_mask, response_len


def _model_logits(model, sequences, attention_mask, response_len):
    # The module's full-logits forward: the full model with logits_to_keep at the predicting positions.
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    length = sequences.shape[1]
    keep = torch.arange(length - response_len - 1, length - 1)
    out = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=keep,
        use_cache=False,
    )
    return out.logits


@pytest.mark.parametrize("tie", [True, False])
def test_hidden_states_times_head_equal_model_logits(tie: bool) -> None:
    model = _tiny_qwen2(tie)
    seq, att, t = _batch()
    hidden = response_hidden_states(model, seq, att, t)
    weight, bias = lm_head_params(model)
    assert hidden.shape == (3, t, 16) and bias is None
    assert (weight is model.get_input_embeddings().weight) == tie
    torch.testing.assert_close(hidden @ weight.T, _model_logits(model, seq, att, t), rtol=1e-12, atol=1e-12)


def test_blockwise_statistics_and_parameter_gradients_equal_full_logits_path() -> None:
    model = _tiny_qwen2(True)
    seq, att, t = _batch()
    responses = seq[:, -t:]
    mask = att[:, -t:].double()

    weight, bias = lm_head_params(model)
    blockwise = linear_entropy_stats(
        response_hidden_states(model, seq, att, t), weight, responses, bias=bias, temperature=0.8, policy_average=True
    )
    blockwise_grads = torch.autograd.grad(
        (mask * (blockwise.logprobs + 0.2 * blockwise.entropy)).sum(), list(model.parameters())
    )

    ref = entropy_stats(_model_logits(model, seq, att, t), responses, temperature=0.8, policy_average=True)
    ref_grads = torch.autograd.grad((mask * (ref.logprobs + 0.2 * ref.entropy)).sum(), list(model.parameters()))
    for got, want in zip(blockwise, ref, strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    for got, want in zip(blockwise_grads, ref_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_lm_head_params_none_when_head_is_not_plain_linear() -> None:
    model = _tiny_qwen2(False)
    model.lm_head = nn.Sequential(nn.Linear(16, 41, bias=False))
    assert lm_head_params(model) is None
    assert lm_head_params(_tiny_qwen2(True, final_logit_softcapping=30.0)) is None
    assert lm_head_params(nn.Linear(3, 4)) is None  # no get_output_embeddings()


def test_no_logits_are_computed() -> None:
    model = _tiny_qwen2(True)
    seq, att, t = _batch()
    calls = []
    model.lm_head.register_forward_hook(lambda mod, args, out: calls.append(tuple(out.shape)))
    response_hidden_states(model, seq, att, t)
    assert calls == [(3, 0, 41)]  # the head saw zero positions


def test_bad_response_len() -> None:
    model = _tiny_qwen2(True)
    seq, att, _ = _batch()
    with pytest.raises(ValueError, match="response_len"):
        response_hidden_states(model, seq, att, 11)

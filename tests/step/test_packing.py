"""Padding-free forwards (``model.update.pack_sequences``): the packed layout, and that log-probs, entropy, S, E_p[S],
hidden states, values and every parameter gradient equal the padded path on the tiny Qwen2 with mixed lengths."""

from __future__ import annotations

import pytest
import torch
from _micro_batch_data import mixed_rollout, random_experience

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.models.tiny import build_qwen2
from lit_entropy.settings import LossConfig, PolicyConfig, RFTSettings, UpdateConfig
from lit_entropy.step import global_loss_normalizer, response_forward, rows_update_loss, value_estimates
from lit_entropy.step.packing import check_packing_attention, first_fit_bins, pack_rows, packed_forward, packs_in_bins

PROMPTS = [3, 7, 5, 2, 6, 4]
RESPONSES = [2, 11, 6, 1, 9, 4]


def _model(attention: str = "sdpa", dtype: torch.dtype = torch.float64):
    torch.manual_seed(0)
    model = build_qwen2(build_char_tokenizer(), num_layers=2, hidden_size=32).to(dtype)
    model.set_attn_implementation(attention)
    return model


@pytest.fixture(scope="module")
def model():
    return _model()


def test_packed_row_holds_each_rows_real_tokens_with_restarting_positions(model):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES, width=13)
    packed = pack_rows(rollout)
    want_ids, want_pos, want_predict, offset = [], [], [], 0
    p_max = max(PROMPTS)
    for i, (p, r) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        want_ids += rollout.sequences[i, p_max - p : p_max + r].tolist()
        want_pos += list(range(p + r))
        want_predict += [offset + p - 1 + t for t in range(r)]
        offset += p + r
    assert packed.input_ids.tolist() == [want_ids] and packed.position_ids.tolist() == [want_pos]
    assert packed.predict.tolist() == want_predict
    # the next packed token is the response token each position predicts
    assert torch.equal(packed.input_ids[0, packed.predict + 1], packed.targets)
    assert torch.equal(packed.targets, rollout.responses[rollout.response_mask])


def test_first_fit_decreasing_bins_by_hand():
    # lengths 5 18 11 3 15 8, width 18: 18 -> bin 0; 15 -> bin 1; 11 -> bin 2; 8 fits none (15+8, 11+8 > 18) -> bin 3;
    # 5 -> bin 2 (11+5); 3 -> bin 1 (15+3)
    bins, offsets, width = first_fit_bins(torch.tensor([5, 18, 11, 3, 15, 8]))
    assert width == 18
    assert bins.tolist() == [2, 0, 2, 1, 1, 3] and offsets.tolist() == [11, 0, 0, 15, 0, 0]


def test_binned_rows_hold_each_rows_real_tokens_with_restarting_positions(model):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES, width=13)
    packed = pack_rows(rollout, binned=True)
    # real lengths 5 18 11 3 15 8: the bins of the test above, 4 x 18
    width, p_max = 18, max(PROMPTS)
    want_ids = [[0] * width for _ in range(4)]
    want_pos = [list(range(width)) for _ in range(4)]  # an unused tail restarts at 0 right after the last row
    want_predict = []
    for i, (b, start) in enumerate([(2, 11), (0, 0), (2, 0), (1, 15), (1, 0), (3, 0)]):
        p, r = PROMPTS[i], RESPONSES[i]
        want_ids[b][start : start + p + r] = rollout.sequences[i, p_max - p : p_max + r].tolist()
        want_pos[b][start : start + p + r] = list(range(p + r))
        want_predict += [b * width + start + p - 1 + t for t in range(r)]
    want_pos[2][16:], want_pos[3][8:] = [0, 1], list(range(10))  # bins 2 and 3 hold 16 and 8 tokens
    assert packed.input_ids.tolist() == want_ids and packed.position_ids.tolist() == want_pos
    assert packed.predict.tolist() == want_predict
    assert torch.equal(packed.input_ids.flatten()[packed.predict + 1], packed.targets)
    assert torch.equal(packed.targets, rollout.responses[rollout.response_mask])
    with pytest.raises(ValueError, match="one row"):
        packed_forward(model, packed, logits=True)


def test_packs_in_bins_except_under_flash_attention():
    assert packs_in_bins(_model("sdpa")) and packs_in_bins(_model("eager"))
    model = _model("sdpa")
    model.config._attn_implementation = "flash_attention_2"  # no flash kernel on CPU: the flag is what is read
    assert not packs_in_bins(model)


# eager in float64: transformers' padded path gives NaN on left-padded rows (float32 is fine), so it runs in float32
@pytest.mark.parametrize(("attention", "dtype", "tol"), [("sdpa", torch.float64, 1e-9), ("eager", torch.float32, 1e-5)])
@pytest.mark.parametrize("blockwise", [True, False])
def test_packed_statistics_equal_the_padded_ones(attention, dtype, tol, blockwise):
    model = _model(attention, dtype)
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES, width=13)
    options = {"temperature": 0.7, "policy_average": True, "hidden": True, "blockwise": blockwise}
    with torch.no_grad():
        want = response_forward(model, rollout, **options)
        got = response_forward(model, rollout, **options, packed=True)
    mask = rollout.response_mask
    for name in ("logprobs", "entropy", "discriminator", "policy_average"):
        a, b = getattr(want.stats, name), getattr(got.stats, name)
        assert b.shape == a.shape
        torch.testing.assert_close(b[mask], a[mask], rtol=tol, atol=tol, msg=name)
    torch.testing.assert_close(got.hidden[mask], want.hidden[mask], rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("blockwise", [True, False])
def test_packed_update_gradients_equal_the_padded_ones(model, mode, blockwise):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES, width=13)
    experience = random_experience(model, rollout)
    grads = []
    for packed in (False, True):
        settings = RFTSettings.build(
            policy=PolicyConfig(blockwise_lm_head=blockwise),
            loss=LossConfig(loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.05),
            update=UpdateConfig(pack_sequences=packed),
        )
        model.zero_grad(set_to_none=True)
        normalizer = global_loss_normalizer(experience.loss_mask, mode)
        rows_update_loss(model, experience, settings, normalizer=normalizer).loss.backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    want, got = grads
    for name, grad in want.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_a_packed_critic_gives_the_padded_values_and_gradients(model):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES, width=13)
    torch.manual_seed(1)
    head = torch.nn.Linear(model.config.hidden_size, 1).double()
    mask = rollout.response_mask
    out = []
    for packed in (False, True):
        model.zero_grad(set_to_none=True)
        values = value_estimates(head, rollout, None, critic=model, packed=packed)
        (values.double() * mask).sum().backward()
        out.append(
            (values[mask].detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})
        )
    (want, want_grads), (got, got_grads) = out
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # values are float32
    assert got_grads.keys() == want_grads.keys() and want_grads
    for name, grad in want_grads.items():
        torch.testing.assert_close(got_grads[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_packing_is_refused_for_an_attention_that_cannot_separate_rows():
    model = _model("flex_attention")
    with pytest.raises(ValueError, match=r"^model\.update\.pack_sequences=true needs .*'flex_attention'") as error:
        check_packing_attention(model)
    assert "\n" not in str(error.value)
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES)
    with pytest.raises(ValueError, match="pack_sequences"):
        response_forward(model, rollout, temperature=1.0, packed=True)


def test_the_statistics_pass_packed_under_a_budget_equals_the_padded_pass(tmp_path):
    from lit_entropy.models.tiny import save_tiny_model
    from lit_entropy.module import RFTModule

    path = str(save_tiny_model(tmp_path / "m", build_char_tokenizer(), num_layers=2))
    modules = []
    for update in (UpdateConfig(), UpdateConfig(max_tokens_per_micro_batch=30, pack_sequences=True)):
        module = RFTModule(PolicyConfig(path), loss=LossConfig(kl_coef=0.1), update=update)
        module.configure_model()
        module.policy.double(), module.ref_model.double()
        modules.append(module)
    rollout = mixed_rollout(modules[0].policy.config.vocab_size, PROMPTS, RESPONSES, width=13)
    want, got = (m.statistics_pass(rollout) for m in modules)
    mask = rollout.response_mask
    for name in ("old_logprobs", "entropy", "discriminator", "ref_logprobs"):
        a, b = getattr(want, name), getattr(got, name)
        assert b.shape == a.shape
        torch.testing.assert_close(b[mask], a[mask], rtol=1e-9, atol=1e-12, msg=name)

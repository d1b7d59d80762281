"""Lightning-free step pieces: the update loss (Dr.GRPO's constant normaliser), evaluation correctness, the
callback protocol's refusal of providers a module never consults."""

from __future__ import annotations

import warnings

import pytest
import torch

from lit_entropy.callbacks import AdaptiveEntropyBonus, ClipCov, EntropyDiscriminatorClipping, KLCov
from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.reporting.evaluation import SampleEvaluator
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import LossConfig, RFTSettings
from lit_entropy.step import Experience, ResponseForward, update_loss


def _rows(advantages: list[float], lengths: list[int], width: int) -> tuple[ResponseForward, Experience]:
    """Rows with the given valid lengths padded to ``width``; log-probs equal the old ones (ratio 1)."""
    n = len(lengths)
    mask = torch.tensor([[t < length for t in range(width)] for length in lengths])
    logprobs = torch.full((n, width), -0.5, dtype=torch.float64, requires_grad=True)
    adv = torch.tensor(advantages, dtype=torch.float64).unsqueeze(-1).expand(n, width).contiguous()
    zeros = torch.zeros(n, width, dtype=torch.float64)
    stats = EntropyStats(logprobs, zeros, zeros, None)
    rollout = RolloutBatch(torch.zeros(n, width + 2, dtype=torch.long), torch.ones(n, width + 2), mask)
    rows = Experience(
        rollout=rollout, rewards=torch.zeros(n), advantages=adv, old_logprobs=logprobs.detach(), entropy=zeros,
        discriminator=zeros, loss_mask=mask,
    )  # fmt: skip
    return ResponseForward(stats), rows


def _settings(loss: LossConfig, max_new_tokens: int) -> RFTSettings:
    return RFTSettings.build(sampling=SamplingConfig(num_samples=2, max_new_tokens=max_new_tokens), loss=loss)


@pytest.mark.parametrize("width", [3, 5, 8])
def test_dr_grpo_divides_by_the_generation_budget_not_the_padded_width(width):
    advantages, lengths = [1.0, -2.0, 0.5], [3, 1, 2]
    forward, rows = _rows(advantages, lengths, width)
    settings = _settings(LossConfig(loss_agg_mode="seq-mean-token-sum-norm"), max_new_tokens=8)
    out = update_loss(forward, rows, settings, normalizer=3.0)
    # Plain-Python reference: at ratio 1 each valid token's loss is -A; per sequence sum / 8, mean over 3 sequences.
    reference = sum(-a * length / 8 for a, length in zip(advantages, lengths, strict=True)) / 3
    assert out.loss.item() == pytest.approx(reference, rel=1e-12)
    explicit = _settings(LossConfig(loss_agg_mode="seq-mean-token-sum-norm", loss_scale_factor=4.0), 8)
    assert update_loss(forward, rows, explicit, normalizer=3.0).loss.item() == pytest.approx(reference * 2, rel=1e-12)


def test_token_sum_adds_every_valid_token_once():
    advantages, lengths = [1.0, -2.0], [3, 1]
    forward, rows = _rows(advantages, lengths, 4)
    out = update_loss(forward, rows, _settings(LossConfig(loss_agg_mode="token-sum"), 4), normalizer=1.0)
    assert out.loss.item() == pytest.approx(-(1.0 * 3) + 2.0 * 1, rel=1e-12)


class _LogRecorder:
    def __init__(self) -> None:
        self.logged: dict[str, object] = {}

    def log(self, name, value, **kwargs) -> None:
        self.logged[name] = value


def test_correctness_is_a_configurable_reward_threshold():
    """Partial-credit and -1/+1 rewards: what counts as correct is the threshold, not reward >= 1."""
    evaluator = SampleEvaluator([1, 2], correct_threshold=0.5)
    rewards = torch.tensor([0.6, 0.4, 0.2, 0.0, 0.5, 0.9])  # 3 prompts x K=2
    rollout = RolloutBatch(torch.zeros(6, 3, dtype=torch.long), torch.ones(6, 3), torch.ones(6, 1, dtype=torch.bool))
    module = _LogRecorder()
    evaluator.update_and_log(module.log, "val", rewards, rollout, k=2)
    assert evaluator.avg.compute().item() == pytest.approx((1 / 2 + 0 + 2 / 2) / 3)
    assert evaluator.passes["1"].compute().item() == pytest.approx((0.5 + 0 + 1) / 3)
    assert {"val/avg@2", "val/pass@2", "val/length/mean"} == set(module.logged)  # pass@1 = avg@2: logged once

    signed = SampleEvaluator([1], correct_threshold=1.0)
    signed.update_and_log(module.log, "val", torch.tensor([-1.0, 1.0, 1.0, -1.0]), rollout.select(slice(0, 4)), k=2)
    assert signed.avg.compute().item() == pytest.approx(0.5)


def test_a_threshold_no_reward_reaches_warns_with_the_observed_range():
    evaluator = SampleEvaluator([1], correct_threshold=1.0)
    rollout = RolloutBatch(torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3), torch.ones(2, 1, dtype=torch.bool))
    evaluator.update_and_log(_LogRecorder().log, "val", torch.tensor([0.25, 0.75]), rollout, k=2)
    with pytest.warns(UserWarning, match=r"correct_threshold=1.0 \(observed rewards in \[0.25, 0.75\]\)"):
        evaluator.check_threshold()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        evaluator.check_threshold()  # once is enough


class _OnlyMasks:
    """A user's module that asks for keep masks only (no token_requests(): the protocol's default)."""

    def token_mask_fields(self):
        return frozenset({"mask", "advantages", "old_logprobs", "entropy", "discriminator"})


@pytest.mark.parametrize(
    ("callback", "wanted"),
    [
        (KLCov(), "token_penalty"),
        (AdaptiveEntropyBonus(), "loss_coefficients"),
    ],
)
def test_a_provider_the_module_never_consults_fails_at_setup(callback, wanted):
    with pytest.raises(TypeError, match=rf"provides .{wanted}. but _OnlyMasks never asks for it"):
        callback.setup(None, _OnlyMasks(), "fit")


def test_mask_providers_still_serve_modules_that_only_ask_for_masks():
    for callback in (ClipCov(), EntropyDiscriminatorClipping("clip_b")):
        callback.setup(None, _OnlyMasks(), "fit")  # no error: keep masks are what the module asks for


def test_blockwise_forward_skips_padding_and_matches_full_logits(tiny_model_dir, monkeypatch):
    """Only the real response tokens go through the blockwise vocabulary pass; their statistics and the parameter
    gradients equal the full-logits path's, and padded positions read 0."""
    from transformers import AutoModelForCausalLM

    import lit_entropy.step.forward as forward_mod

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    sequences = torch.randint(4, model.config.vocab_size, (3, 9))
    response_mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    attention_mask = torch.cat([torch.ones(3, 4, dtype=torch.long), response_mask.long()], dim=1)
    rollout = RolloutBatch(sequences=sequences, attention_mask=attention_mask, response_mask=response_mask)
    rows_seen = []
    real = forward_mod.linear_entropy_stats
    monkeypatch.setattr(
        forward_mod, "linear_entropy_stats", lambda h, *a, **k: rows_seen.append(h.shape[0]) or real(h, *a, **k)
    )
    results = {}
    for blockwise in (True, False):
        model.zero_grad()
        stats = forward_mod.response_forward(
            model, rollout, temperature=0.7, policy_average=True, blockwise=blockwise
        ).stats
        loss = (response_mask * (stats.logprobs + 0.3 * stats.entropy)).sum()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        results[blockwise] = (stats, grads)
    assert rows_seen == [int(response_mask.sum())]  # 11 of 15 positions
    (blockwise_stats, blockwise_grads), (full_stats, full_grads) = results[True], results[False]
    for got, want in zip(blockwise_stats, full_stats, strict=True):
        torch.testing.assert_close(got[response_mask], want[response_mask].detach(), atol=1e-5, rtol=1e-5)
        assert bool((got[~response_mask] == 0).all())
    for got, want in zip(blockwise_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_blockwise_loss_path_matches_the_full_logits_update_loss(tiny_model_dir, monkeypatch, loss_agg_mode):
    """A separate update forward forms the head's gradient inside the vocabulary pass: its loss, logged terms and
    every parameter gradient equal the full-logits path's (clipped ratios, KL, entropy bonus, token penalty on)."""
    from transformers import AutoModelForCausalLM

    import lit_entropy.step.forward as forward_mod
    from lit_entropy.settings import PolicyConfig
    from lit_entropy.step import rows_update_loss

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    gen = torch.Generator().manual_seed(3)
    n, prompt, width = 4, 3, 6
    sequences = torch.randint(4, model.config.vocab_size, (n, prompt + width), generator=gen)
    response_mask = torch.tensor([[t < length for t in range(width)] for length in (6, 2, 4, 5)])
    attention_mask = torch.cat([torch.ones(n, prompt, dtype=torch.long), response_mask.long()], dim=1)
    rollout = RolloutBatch(sequences=sequences, attention_mask=attention_mask, response_mask=response_mask)
    with torch.no_grad():
        current = forward_mod.response_forward(model, rollout, temperature=0.8, blockwise=False).stats.logprobs
    # Old log-probs off by up to +-0.5 so that both ratio clips bind on some tokens.
    old = current + torch.empty(n, width).uniform_(-0.5, 0.5, generator=gen)
    adv = torch.tensor([1.0, -0.5, 2.0, -1.5]).unsqueeze(1).expand(n, width).contiguous()
    keep = response_mask & (torch.rand(n, width, generator=gen) > 0.2)
    zeros = torch.zeros(n, width)
    rows = Experience(
        rollout=rollout, rewards=torch.zeros(n), advantages=adv, old_logprobs=old, entropy=zeros, discriminator=zeros,
        ref_logprobs=current - 0.3, loss_mask=keep, penalty=torch.full((n, width), 0.05),
    )  # fmt: skip
    rows.coefficients = {"entropy_coef": 0.02}
    loss = LossConfig(loss_agg_mode=loss_agg_mode, kl_coef=0.1, clip_ratio_high=0.28, clip_ratio_c=3.0)
    sampling = SamplingConfig(num_samples=2, max_new_tokens=width, temperature=0.8)
    calls = []
    real = forward_mod.linear_entropy_loss
    monkeypatch.setattr(forward_mod, "linear_entropy_loss", lambda *a, **k: calls.append(1) or real(*a, **k))
    results = {}
    for blockwise in (True, False):
        settings = RFTSettings.build(sampling=sampling, loss=loss, policy=PolicyConfig(blockwise_lm_head=blockwise))
        model.zero_grad()
        out = rows_update_loss(model, rows, settings, normalizer=float(keep.sum()))
        out.loss.backward()
        results[blockwise] = (out, [p.grad.clone() for p in model.parameters()])
    assert calls == [1]
    (blockwise_out, blockwise_grads), (full_out, full_grads) = results[True], results[False]
    torch.testing.assert_close(blockwise_out.loss.detach(), full_out.loss.detach(), rtol=1e-5, atol=1e-6)
    assert blockwise_out.terms.keys() == full_out.terms.keys() >= {"pg_loss", "kl", "entropy_bonus", "token_penalty"}
    for key, value in blockwise_out.terms.items():
        torch.testing.assert_close(value, full_out.terms[key], rtol=1e-5, atol=1e-6)
    for got, want in zip(blockwise_out.policy_stats, full_out.policy_stats, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert int(blockwise_out.loss_tokens) == int(full_out.loss_tokens) == int(keep.sum())
    for got, want in zip(blockwise_grads, full_grads, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

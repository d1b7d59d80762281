"""Exact sampling: the inverse-CDF sampler and the HF rollout engine against analytically computed distributions."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional.sampling import CategoricalSampler, sample_categorical
from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.hf import HFRolloutEngine


def _assert_frequencies(draws: torch.Tensor, probs: torch.Tensor, sigmas: float = 5.0) -> None:
    """Each category's count within ``sigmas`` binomial standard deviations of ``n p``."""
    n = draws.numel()
    counts = torch.bincount(draws, minlength=probs.numel()).double()
    expected = n * probs.double()
    sd = (n * probs.double() * (1 - probs.double())).sqrt()
    assert bool((counts[probs == 0] == 0).all()), "a zero-probability category was drawn"
    worst = ((counts - expected).abs() / sd.clamp(min=1e-12))[probs > 0].max().item()
    assert worst < sigmas, f"counts {counts.tolist()} vs expected {expected.tolist()} ({worst:.1f} sd)"


def test_sampler_matches_softmax_with_masked_tokens():
    logits = torch.tensor([1.0, float("-inf"), -0.5, 2.0, float("-inf"), 0.0])
    probs = torch.softmax(logits, 0)
    gen = torch.Generator().manual_seed(0)
    sampler = CategoricalSampler()
    draws = torch.cat([sampler(logits.expand(20000, -1), gen) for _ in range(5)])
    _assert_frequencies(draws, probs)


def test_sampler_long_tail_mass():
    # Qwen-sized rows: one dominant token and 20000 tail tokens of relative weight 5e-6 (9% of the mass together).
    tail = 20000
    logits = torch.full((tail + 1,), math.log(5e-6))
    logits[0] = 0.0
    tail_mass = tail * 5e-6 / (1 + tail * 5e-6)
    gen = torch.Generator().manual_seed(1)
    sampler = CategoricalSampler(block=64)  # 313 blocks: the tail spans both levels of the search
    draws = torch.cat([sampler(logits.expand(500, -1), gen) for _ in range(10)])
    hits = int((draws > 0).sum())
    expected = draws.numel() * tail_mass
    assert abs(hits - expected) < 5 * math.sqrt(expected * (1 - tail_mass)), (hits, expected)
    # Every tail token is equally likely: the hits spread over the tail (no bias toward its start or end).
    tail_draws = draws[draws > 0].double()
    assert abs(tail_draws.mean().item() - (tail + 1) / 2) < 5 * tail / math.sqrt(12 * hits)


@pytest.mark.parametrize("block", [1, 3, 4, 1024])
def test_two_level_search_picks_the_flat_inverse_cdf_token(block):
    # The same uniform draw must select the same token as a flat float64 inverse CDF over the whole row, with
    # the vocabulary not a multiple of the block, whole blocks of -inf and masked tokens at block edges.
    gen = torch.Generator().manual_seed(3)
    scores = torch.randn(600, 11, generator=gen) * 3
    scores[:200, 4:8] = float("-inf")
    scores[200:400, ::3] = float("-inf")
    scores[400:, :-1] = float("-inf")  # only the last (padded-block) token is possible
    sampler = CategoricalSampler(block=block)
    seed = torch.Generator().manual_seed(7)
    ids = torch.cat([sampler(scores, seed) for _ in range(3)])
    replay = torch.Generator().manual_seed(7)
    e = torch.exp(scores - scores.amax(1, keepdim=True)).double()
    cdf = e.cumsum(1)
    flat = []
    for _ in range(3):
        u = (1.0 - torch.rand(600, 1, dtype=torch.float64, generator=replay)) * cdf[:, -1:]
        flat.append(torch.searchsorted(cdf, u).squeeze(1))
    flat = torch.cat(flat)
    assert bool(torch.isfinite(scores.repeat(3, 1).gather(1, ids[:, None])).all()), "a -inf token was drawn"
    assert (ids != flat).sum().item() == 0, (ids != flat).nonzero()[:5]


def test_sampler_with_small_blocks_matches_softmax():
    logits = torch.tensor([1.0, float("-inf"), -0.5, 2.0, float("-inf"), 0.0, -1.0])
    probs = torch.softmax(logits, 0)
    gen = torch.Generator().manual_seed(4)
    sampler = CategoricalSampler(block=2)
    draws = torch.cat([sampler(logits.expand(20000, -1), gen) for _ in range(5)])
    _assert_frequencies(draws, probs)
    with pytest.raises(ValueError, match="block must be a positive int, got 0"):
        CategoricalSampler(block=0)


def test_sampler_rejects_nan_rows_and_all_masked_rows():
    scores = torch.tensor([[0.0, 1.0], [float("nan"), 0.0], [float("-inf"), float("-inf")]])
    with pytest.raises(ValueError, match=r"rows \[1, 2\]"):
        sample_categorical(scores)
    with pytest.raises(ValueError, match="rows, V"):
        sample_categorical(torch.zeros(3))


def _first_token_probs(model, prompt_ids, temperature, top_k, top_p):
    """The distribution HF's warpers define for the first response token, computed by hand."""
    with torch.no_grad():
        logits = model(input_ids=prompt_ids).logits[0, -1].double() / temperature
    probs = torch.softmax(logits, 0)
    if top_k:
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[probs.topk(top_k).indices] = True
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    if top_p < 1:
        order = probs.argsort(descending=True)
        before = probs[order].cumsum(0) - probs[order]  # mass strictly above each token
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[order[before < top_p]] = True
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    return probs


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 6, 1.0), (1.3, 0, 0.6)])
def test_hf_engine_samples_the_warped_policy(tiny_model_dir, temperature, top_k, top_p):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # A checkpoint default that would change the distribution: the engine must not apply it.
    model.generation_config.repetition_penalty = 5.0
    model.generation_config.top_k = 2
    prompt = torch.tensor([[5, 6, 7, 8]])
    probs = _first_token_probs(model, prompt, temperature, top_k, top_p)
    engine = HFRolloutEngine(eos_token_id=1, pad_token_id=0)
    sampling = SamplingConfig(num_samples=4000, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=1)
    torch.manual_seed(0)
    batch = engine.generate(model, prompt, torch.ones_like(prompt), sampling)
    assert batch.sequences.shape == (4000, 5)
    assert model.generation_config.repetition_penalty == 5.0  # restored
    _assert_frequencies(batch.sequences[:, -1], probs.float())


@pytest.mark.parametrize("bias", [False, True])
def test_tall_lm_head_matches_the_linear_head_and_is_restored(bias):
    from torch import nn

    from lit_entropy.rollout.hf import TALL_HEAD_MAX_ROWS, tall_lm_head

    class Policy(nn.Module):
        def __init__(self):
            super().__init__()
            self.head = nn.Linear(16, 300, bias=bias)

        def get_output_embeddings(self):
            return self.head

    policy = Policy()
    gen = torch.Generator().manual_seed(0)
    small = torch.randn(3, 1, 16, generator=gen)  # the decode step's [rows, 1, H]
    large = torch.randn(TALL_HEAD_MAX_ROWS + 1, 16, generator=gen)
    reference = [small @ policy.head.weight.T, large @ policy.head.weight.T]
    if bias:
        reference = [r + policy.head.bias for r in reference]
    calls = []
    mm = torch.mm
    with tall_lm_head(policy):
        assert "forward" in vars(policy.head)
        torch.mm = lambda *a, **k: calls.append(a[0].shape) or mm(*a, **k)
        try:
            out_small, out_large = policy.head(small), policy.head(large)
        finally:
            torch.mm = mm
    assert calls == [(300, 16)]  # only the small batch took the tall product
    assert out_small.shape == (3, 1, 300) and out_small.is_contiguous()
    torch.testing.assert_close(out_small, reference[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(out_large, reference[1], rtol=1e-5, atol=1e-6)
    assert "forward" not in vars(policy.head)  # the module's own forward is back


def test_hf_engine_with_tall_head_draws_the_same_tokens(tiny_model_dir, monkeypatch):
    # Same seed with and without the tall product: the logits differ only by float32 rounding, so the sampled
    # tokens (a few hundred draws) are the same.
    from transformers import AutoModelForCausalLM

    import lit_entropy.rollout.hf as hf

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    engine = HFRolloutEngine(eos_token_id=1, pad_token_id=0)
    sampling = SamplingConfig(num_samples=16, temperature=1.0, max_new_tokens=12)
    weight_shape = model.get_output_embeddings().weight.shape
    runs, tall_calls = [], []
    mm = torch.mm
    for limit in (hf.TALL_HEAD_MAX_ROWS, 0):
        monkeypatch.setattr(hf, "TALL_HEAD_MAX_ROWS", limit)
        calls = []
        spy = lambda *a, _calls=calls, **k: _calls.append(a[0].shape == weight_shape) or mm(*a, **k)  # noqa: E731
        monkeypatch.setattr(torch, "mm", spy)
        torch.manual_seed(5)
        runs.append(engine.generate(model, prompt, torch.ones_like(prompt), sampling).sequences)
        monkeypatch.setattr(torch, "mm", mm)
        tall_calls.append(sum(calls))
    assert tall_calls[0] >= sampling.max_new_tokens - 1 and tall_calls[1] == 0
    assert torch.equal(runs[0], runs[1])


def _float64_inverse_cdf(scores: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """The token a flat float64 inverse CDF picks for the next uniform draw of ``generator``, per row."""
    e = torch.exp(scores.double() - scores.double().amax(1, keepdim=True))
    cdf = e.cumsum(1)
    u = (1.0 - torch.rand(scores.shape[0], 1, dtype=torch.float64, generator=generator)) * cdf[:, -1:]
    return torch.searchsorted(cdf, u).squeeze(1)


def test_bfloat16_scores_are_sampled_as_a_float64_inverse_cdf():
    # 2047 tail tokens at 0.390625 and one at 8.0 (last): 8 - 0.390625 = 7.609375 needs 9 significant bits, so a
    # bfloat16 subtraction rounds every tail token's log-weight by 1/64 and moves the tail/head boundary of the CDF
    # by ~0.8% of the draws. Computed in float32, every draw picks the float64 inverse CDF's token.
    scores = torch.full((5000, 2048), 0.390625, dtype=torch.bfloat16)
    scores[:, -1] = 8.0
    ids, logprobs = CategoricalSampler().sample(scores, torch.Generator().manual_seed(11))
    reference = _float64_inverse_cdf(scores, torch.Generator().manual_seed(11))
    assert (ids != reference).sum().item() == 0
    assert 0.3 < (ids == 2047).float().mean().item() < 0.7  # the boundary is exercised
    expected = torch.log_softmax(scores.double(), 1).gather(1, ids[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs.double(), expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_sampled_logprobs_are_the_float64_log_softmax(dtype):
    gen = torch.Generator().manual_seed(5)
    scores = (torch.randn(64, 3000, generator=gen) * 4).to(dtype)
    scores[:8, 100:] = float("-inf")  # a top-k-like kept set: log-probs of the renormalised distribution
    ids, logprobs = CategoricalSampler(block=256).sample(scores, gen)
    assert logprobs.dtype == torch.float32 and bool(torch.isfinite(scores.gather(1, ids[:, None])).all())
    expected = torch.log_softmax(scores.double(), 1).gather(1, ids[:, None]).squeeze(1)
    torch.testing.assert_close(logprobs.double(), expected, rtol=0, atol=2e-6)


def _reference_logprobs(model, batch, temperature, top_k, top_p):
    """float64 log-probs of each response token under HF's warped distribution, from one full forward per row."""
    prompt_length = batch.prompt_length
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float64)
    with torch.no_grad():
        logits = model(input_ids=batch.sequences, attention_mask=batch.attention_mask).logits.double()
    for row in range(batch.sequences.shape[0]):
        for t in range(int(batch.response_mask[row].sum())):
            step_logits = logits[row, prompt_length + t - 1] / temperature
            probs = torch.softmax(step_logits, 0)
            keep = torch.ones_like(probs, dtype=torch.bool)
            if top_k:
                keep = probs >= probs.topk(top_k).values[-1]
            kept = torch.where(keep, probs, 0.0) / torch.where(keep, probs, 0.0).sum()
            if top_p < 1:
                order = kept.argsort(descending=True)
                before = kept[order].cumsum(0) - kept[order]
                nucleus = torch.zeros_like(keep)
                nucleus[order[before < top_p]] = True
                kept = torch.where(nucleus, kept, 0.0) / torch.where(nucleus, kept, 0.0).sum()
            out[row, t] = kept[batch.responses[row, t]].log()
    return out


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(1.0, 0, 1.0), (0.7, 5, 1.0), (1.2, 0, 0.5)])
def test_hf_engine_reports_the_log_probs_it_sampled_from(tiny_model_dir, temperature, top_k, top_p):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    engine = HFRolloutEngine(eos_token_id=1, pad_token_id=0)
    assert engine.reports_logprobs
    prompt = torch.tensor([[0, 5, 6, 7], [9, 8, 7, 6]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])
    sampling = SamplingConfig(num_samples=3, temperature=temperature, top_k=top_k, top_p=top_p, max_new_tokens=6)
    torch.manual_seed(1)
    batch = engine.generate(model, prompt, mask, sampling)
    assert batch.rollout_logprobs.shape == batch.response_mask.shape
    assert (batch.rollout_logprobs[~batch.response_mask] == 0).all()
    expected = _reference_logprobs(model, batch, temperature, top_k, top_p)
    got = batch.rollout_logprobs.double().masked_fill(~batch.response_mask, 0.0)
    torch.testing.assert_close(got, expected.masked_fill(~batch.response_mask, 0.0), rtol=0, atol=2e-4)

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
    sampler = CategoricalSampler()
    draws = torch.cat([sampler(logits.expand(500, -1), gen) for _ in range(10)])
    hits = int((draws > 0).sum())
    expected = draws.numel() * tail_mass
    assert abs(hits - expected) < 5 * math.sqrt(expected * (1 - tail_mass)), (hits, expected)
    # Every tail token is equally likely: the hits spread over the tail (no bias toward its start or end).
    tail_draws = draws[draws > 0].double()
    assert abs(tail_draws.mean().item() - (tail + 1) / 2) < 5 * tail / math.sqrt(12 * hits)


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

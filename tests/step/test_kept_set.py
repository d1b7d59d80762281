"""``model.rollout_correction.kept_set_logprobs`` on the HF engine: the engine reports log-probs of the top-p
distribution it sampled from; renormalising the trainer's over the same kept set removes the mismatch."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.functional.rollout_correction import mismatch_metrics
from lit_entropy.rollout import HFRolloutEngine, SamplingConfig
from lit_entropy.settings import RFTSettings, RolloutCorrectionConfig
from lit_entropy.step import RolloutStatistics, build_experience, response_forward
from lit_entropy.step.kept_set import kept_set_log_mass


@pytest.mark.parametrize("top_k", [0, 4])
def test_the_kept_set_removes_the_top_p_mismatch_on_the_hf_engine(tiny_model_dir, top_k):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sampling = SamplingConfig(num_samples=4, temperature=0.9, top_p=0.5, top_k=top_k, max_new_tokens=8)
    prompt = torch.tensor([[5, 6, 7, 8], [0, 9, 8, 7]])
    torch.manual_seed(2)
    rollout = HFRolloutEngine(eos_token_id=1, pad_token_id=0).generate(model, prompt, (prompt > 0).long(), sampling)
    rewards = torch.arange(8, dtype=torch.float32) % 2
    metrics = {}
    for kept in (False, True):
        correction = RolloutCorrectionConfig(level="token", kept_set_logprobs=kept)
        settings = RFTSettings.build(sampling=sampling, rollout_correction=correction)
        with torch.no_grad():
            stats = response_forward(model, rollout, temperature=sampling.temperature).stats
        mass = kept_set_log_mass(model, rollout, settings)
        assert (mass is None) == (not kept)
        statistics = RolloutStatistics.from_passes(stats, kept_log_mass=mass)
        exp = build_experience(rollout, rewards, statistics, settings)
        metrics[kept] = mismatch_metrics(exp.mismatch)
    # Without: trainer minus engine log-prob is log(kept mass) < 0 at every filtered step, so k1 = -E[log mass].
    assert metrics[False]["kl_k1"] > 0.05 and metrics[False]["ppl_ratio"] < 0.95
    assert abs(metrics[True]["kl_k1"]) < 1e-5 and metrics[True]["kl_k3"] < 1e-8
    assert metrics[True]["ppl_ratio"] == pytest.approx(1.0, abs=1e-5) and metrics[True]["ess"] > 1 - 1e-8

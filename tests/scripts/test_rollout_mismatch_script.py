"""scripts/bench/rollout_mismatch.py: the per-case summary by hand, and one HF step of the embedded default under
top_p 0.5 with and without kept-set log-probs."""

from __future__ import annotations

import pytest
from _scripts import load_script


@pytest.fixture
def script():
    return load_script("scripts.bench.rollout_mismatch")


def test_summary_is_the_mean_over_steps_and_the_largest_gap(script):
    base = {"kl_k1": 0.0, "kl_k3": 0.0, "ppl_ratio": 1.0, "ess": 1.0, "frac_above": 0.0, "frac_below": 0.0}
    steps = [
        {**base, "kl_k1": 0.1, "ess": 0.9, "frac_above": 0.25, "logprob_gap_max": 0.5},
        {**base, "kl_k1": 0.3, "ess": 0.7, "frac_above": 0.0, "logprob_gap_max": 2.0},
    ]
    out = script.summarize(steps)
    assert out["kl_k1"] == pytest.approx(0.2) and out["ess"] == pytest.approx(0.8)
    assert out["frac_above"] == pytest.approx(0.125) and out["gap_max"] == 2.0 and out["ppl_ratio"] == 1.0
    row = script.format_table([(("vllm", "float32", 0.5, True), out)])
    assert "| vLLM (float32) | 0.5 | yes | 0.2 |" in row


def test_top_p_half_on_the_hf_engine_differs_by_the_kept_mass_unless_renormalised(script):
    truncated = script.summarize(script.run_case(("hf", None, 0.5, False), steps=1))
    renormalised = script.summarize(script.run_case(("hf", None, 0.5, True), steps=1))
    # The engine's log-probs are of the top-p-renormalised distribution: above the trainer's full-softmax ones by
    # -log(kept mass) > 0 on every token where top-p drops something, so KL k1 > 0 and the weights spread (ESS < 1).
    assert truncated["kl_k1"] > 0.01 and truncated["kl_k3"] > 1e-3 and truncated["ess"] < 0.999
    assert abs(renormalised["kl_k1"]) < 1e-5 and renormalised["kl_k3"] < 1e-9 and renormalised["gap_max"] < 1e-4

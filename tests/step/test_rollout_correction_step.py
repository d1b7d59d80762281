"""Rollout correction in the step: the weights stay apart from the advantages (callbacks read the estimator's
advantages) and multiply each token's policy-loss term."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import LossConfig, RFTSettings, RolloutCorrectionConfig
from lit_entropy.step import ResponseForward, RolloutStatistics, build_experience, update_loss

WIDTH = 3


def _batch():
    """Two prompts x two samples; the engine's log-probs differ from the trainer's by known amounts."""
    mask = torch.tensor([[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]], dtype=torch.bool)
    trainer = torch.tensor([[-0.5, -1.0, -0.2], [-0.3, -0.3, 0.0], [-2.0, 0.0, 0.0], [-0.1, -0.4, -0.9]])
    gap = torch.tensor([[1.0, -0.2, 0.05], [0.0, -1.5, 0.0], [0.4, 0.0, 0.0], [-0.01, 0.02, 0.9]])
    rollout = RolloutBatch(
        torch.ones(4, 2 + WIDTH, dtype=torch.long), torch.ones(4, 2 + WIDTH), mask, rollout_logprobs=trainer - gap
    )
    zeros = torch.zeros(4, WIDTH)
    statistics = RolloutStatistics(old_logprobs=trainer, entropy=zeros, discriminator=zeros)
    return rollout, statistics, torch.tensor([1.0, 0.0, 0.0, 1.0]), gap


def _grpo(group: list[float]) -> list[float]:
    mean = sum(group) / len(group)
    std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1))
    return [(r - mean) / (std + 1e-6) for r in group]


@pytest.mark.parametrize("level", [None, "token", "geometric"])
def test_callbacks_read_the_estimators_advantages_with_correction_on(level):
    rollout, statistics, rewards, gap = _batch()
    correction = RolloutCorrectionConfig(level=level, upper=1.5) if level else RolloutCorrectionConfig()
    sampling = SamplingConfig(num_samples=2, max_new_tokens=WIDTH)
    settings = RFTSettings.build(sampling=sampling, loss=LossConfig(rollout_correction=correction))
    exp = build_experience(rollout, rewards, statistics, settings)
    expected = _grpo([1.0, 0.0]) + _grpo([0.0, 1.0])
    context, mask = exp.token_context(), rollout.response_mask
    for row in range(4):
        want = [expected[row] if mask[row, t] else 0.0 for t in range(WIDTH)]
        assert context.advantages[row].tolist() == pytest.approx(want, rel=1e-5)
        assert exp.advantages[row].tolist() == pytest.approx(want, rel=1e-5)
    if level is None:
        assert exp.rollout_weights is None and exp.mismatch is not None
        return
    for row in range(4):
        valid = [gap[row, t].item() for t in range(WIDTH) if mask[row, t]]
        for t in range(WIDTH):
            log_w = gap[row, t].item() if level == "token" else sum(valid) / len(valid)
            want = min(math.exp(log_w), 1.5) if mask[row, t] else 0.0
            assert exp.rollout_weights[row, t].item() == pytest.approx(want, rel=1e-6)


def test_the_weights_multiply_each_tokens_policy_loss_term():
    rollout, statistics, rewards, gap = _batch()
    correction = RolloutCorrectionConfig(level="token", mode="mask", upper=2.0, lower=0.5)
    settings = RFTSettings.build(
        sampling=SamplingConfig(num_samples=2, max_new_tokens=WIDTH),
        loss=LossConfig(clip_ratio_c=None, rollout_correction=correction),
    )  # fmt: skip
    exp = build_experience(rollout, rewards, statistics, settings)
    logprobs = (statistics.old_logprobs + torch.tensor([0.3, -0.3, 0.05])).double().requires_grad_()
    zeros = torch.zeros(4, WIDTH, dtype=torch.float64)
    out = update_loss(ResponseForward(EntropyStats(logprobs, zeros, zeros, None)), exp, settings, normalizer=9.0)
    mask = rollout.response_mask
    total = 0.0
    for row, t in mask.nonzero().tolist():
        w = math.exp(gap[row, t].item())
        w = w if 0.5 <= w <= 2.0 else 0.0
        r = math.exp(logprobs[row, t].item() - statistics.old_logprobs[row, t].item())
        a = exp.advantages[row, t].item()
        total += w * max(-a * r, -a * min(max(r, 0.8), 1.2))
    assert out.loss.item() == pytest.approx(total / 9.0, rel=1e-5)
    # Tokens (0, 0) and (3, 2) (w > 2) and (1, 1) (w < 0.5) are masked: no gradient reaches them.
    (grad,) = torch.autograd.grad(out.loss, logprobs)
    assert grad[0, 0] == 0 and grad[3, 2] == 0 and grad[1, 1] == 0 and grad[0, 1] != 0


def test_correction_with_an_engine_that_reports_nothing_is_refused_at_construction():
    from lit_entropy.module import RFTModule
    from lit_entropy.rollout import HFRolloutEngine

    class Silent(HFRolloutEngine):
        reports_logprobs = False

    correction = RolloutCorrectionConfig(level="sequence")
    with pytest.raises(ValueError, match=r"level='sequence' needs the log-probs .* model.rollout=Silent reports none"):
        RFTModule(rollout=Silent(), loss=LossConfig(rollout_correction=correction))
    RFTModule(rollout=Silent())  # metrics only when reported: nothing to refuse without a correction
    corrected = RFTModule(loss=LossConfig(rollout_correction=correction))
    assert corrected.rollout_engine.reports_logprobs  # the default HF engine

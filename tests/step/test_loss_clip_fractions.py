"""``train/clip/*`` are the policy loss's own clip fractions (its clip rule), token-weighted over micro-batches:
gspo and cispo against fractions counted by hand, which PPO's token rule would get wrong."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.module import RFTModule
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import LossConfig
from lit_entropy.step import Experience, ResponseForward, update_loss

LENGTHS = [3, 1, 4, 2]
WIDTH = 4
ADVANTAGES = [1.0, -1.0, 1.0, -1.0]


def _rows_and_forward(log_ratios: list[list[float]]) -> tuple[Experience, ResponseForward]:
    """Rows with old log-probs -1 and current ones -1 + the given log-ratios (padding beyond each length)."""
    n = len(LENGTHS)
    mask = torch.tensor([[t < length for t in range(WIDTH)] for length in LENGTHS])
    rollout = RolloutBatch(torch.zeros(n, WIDTH + 2, dtype=torch.long), torch.ones(n, WIDTH + 2), mask)
    old = torch.full((n, WIDTH), -1.0)
    padded = torch.tensor([row + [0.0] * (WIDTH - len(row)) for row in log_ratios])
    zeros = torch.zeros(n, WIDTH)
    advantages = torch.tensor(ADVANTAGES).unsqueeze(-1).expand(n, WIDTH).contiguous()
    rows = Experience(
        rollout=rollout, rewards=torch.zeros(n), advantages=advantages, old_logprobs=old, entropy=zeros,
        discriminator=zeros, loss_mask=mask.clone(),
    )  # fmt: skip
    logprobs = (old + padded).requires_grad_()
    stats = EntropyStats(logprobs=logprobs, entropy=zeros, discriminator=zeros, policy_average=None)
    return rows, ResponseForward(stats)


def _logged_fractions(loss: LossConfig, log_ratios: list[list[float]]) -> dict[str, float]:
    """What the module accumulates for ``train/clip/*`` over two micro-batches (rows 0-1, then rows 2-3)."""
    module = RFTModule(sampling=SamplingConfig(num_samples=2), loss=loss)
    rows, forward = _rows_and_forward(log_ratios)
    for part in (slice(0, 2), slice(2, 4)):
        index = torch.arange(4)[part]
        sub = rows.rows(index)
        sub_forward = ResponseForward(
            EntropyStats(
                logprobs=forward.stats.logprobs[part], entropy=forward.stats.entropy[part],
                discriminator=forward.stats.discriminator[part], policy_average=None,
            )
        )  # fmt: skip
        out = update_loss(sub_forward, sub, module.settings, normalizer=10.0)
        module.update_clip(out, sub)
    return {key: float(value) for key, value in module.clip_fractions.compute().items()}


def test_gspo_clip_fractions_count_every_token_of_a_clipped_sequence():
    # 10 loss tokens. Sequence means of the log-ratio: 0.1 (s = 1.105 > 1.1, A > 0: high), 0.05 (inside),
    # 0 (inside), -0.3 (s = 0.74 < 0.9, A < 0: low).
    log_ratios = [[0.6, -0.1, -0.2], [0.05], [0.5, -0.5, 0.0, 0.0], [-0.3, -0.3]]
    got = _logged_fractions(LossConfig(policy_loss="gspo", clip_ratio_low=0.1, clip_ratio_high=0.1), log_ratios)
    # by hand: sequence 0's 3 tokens high, sequence 3's 2 tokens low, of 10 tokens
    assert got["high"] == pytest.approx(3 / 10) and got["low"] == pytest.approx(2 / 10)
    assert got["total"] == pytest.approx(5 / 10) and got["dual"] == 0.0
    # PPO's token rule on the same ratios would say high 2/10 (sequence 0's first token, sequence 2's first)
    ppo_high = sum(math.exp(r) > 1.1 for row, a in zip(log_ratios, ADVANTAGES, strict=True) for r in row if a > 0)
    assert ppo_high == 2


def test_cispo_clip_fractions_count_capped_weights_of_either_advantage_sign():
    # r = 1.82 (A > 0: cut high), 0.74 (A > 0: cut low), 1.65 (A < 0: cut high), 0.61 (A < 0: cut low)
    log_ratios = [[0.6, 0.0, -0.3], [0.5], [0.0, 0.0, 0.0, 0.0], [-0.5, 0.0]]
    got = _logged_fractions(LossConfig(policy_loss="cispo", clip_ratio_low=0.2, clip_ratio_high=0.2), log_ratios)
    assert got["high"] == pytest.approx(2 / 10) and got["low"] == pytest.approx(2 / 10)
    assert got["total"] == pytest.approx(4 / 10)


def test_ppo_clip_fractions_are_unchanged_and_include_the_dual_clip():
    # r = 1.82 with A > 0 (high), r = 4.48 with A < 0 (dual clip at 3, not low/high), r = 0.61 with A < 0 (low)
    log_ratios = [[0.6, 0.0, 0.0], [1.5], [0.0, 0.0, 0.0, 0.0], [-0.5, 0.0]]
    got = _logged_fractions(LossConfig(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0), log_ratios)
    assert (got["low"], got["high"], got["total"], got["dual"]) == pytest.approx((0.1, 0.1, 0.2, 0.1))

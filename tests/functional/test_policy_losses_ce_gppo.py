"""CE-GPPO against a float64 transcription of its authors' loss; SAPO / DPPO's first-order property.

Reference: ``compute_gppo_loss_general_beta`` of GitHub Kwai-Klear/CE-GPPO at commit
10558fe017ac776773fd7f29753d8353a11c0813, ``verl/trainer/ppo/core_algos.py``, restated below in float64 with
``token-mean`` aggregation (verl's ``agg_loss``) and the loss mask. (verl 0.9.1 has no CE-GPPO; SAPO and DPPO are
checked against verl in tests/oracles.)
"""

from __future__ import annotations

import pytest
import torch

from lit_entropy.functional import POLICY_LOSSES

F64 = torch.float64
SEEDS = range(16)


def _ref_ce_gppo(old_log_prob, log_prob, advantages, response_mask, cliprange_low, cliprange_high, clip_ratio_c,
                 beta1, beta2):  # fmt: skip
    negative_approx_kl = log_prob - old_log_prob
    ratio = torch.exp(negative_approx_kl)
    ratio_detached = ratio.detach()
    low_mask = (ratio < (1 - cliprange_low)) & (advantages < 0)
    high_mask = (ratio > (1 + cliprange_high)) & (advantages > 0)
    other_mask = ~(low_mask | high_mask)
    clip_pg_losses1 = torch.zeros_like(advantages)
    clip_pg_losses1[low_mask] = (
        -beta1 * (1 - cliprange_low) / ratio_detached[low_mask] * ratio[low_mask] * advantages[low_mask]
    )
    clip_pg_losses1[high_mask] = (
        -beta2 * (1 + cliprange_high) / ratio_detached[high_mask] * ratio[high_mask] * advantages[high_mask]
    )
    clip_pg_losses1[other_mask] = -ratio[other_mask] * advantages[other_mask]
    pg_clipfrac = ((low_mask | high_mask).to(F64) * response_mask).sum() / response_mask.sum()
    pg_losses3 = -advantages * clip_ratio_c
    clip_pg_losses2 = torch.min(pg_losses3, clip_pg_losses1)
    pg_clipfrac_lower = (
        (torch.gt(clip_pg_losses1, pg_losses3) * (advantages < 0)).to(F64) * response_mask
    ).sum() / response_mask.sum()
    pg_losses = torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)
    return (pg_losses * response_mask).sum() / response_mask.sum(), pg_clipfrac, pg_clipfrac_lower


def _case(seed: int, spread: float = 0.4):
    g = torch.Generator().manual_seed(seed)
    n, t = 6, 7
    old = -torch.rand(n, t, generator=g, dtype=F64) * 3 - 0.05
    logprobs = old + spread * torch.randn(n, t, generator=g, dtype=F64)
    logprobs[seed % n] = old[seed % n]  # an on-policy row
    mask = torch.rand(n, t, generator=g) > 0.2
    mask[(seed + 1) % n] = False  # a row without a valid token
    mask[(seed + 2) % n, 0] = True
    seq = torch.randint(-1, 2, (n,), generator=g).to(F64) if seed % 2 else torch.randn(n, generator=g, dtype=F64)
    adv = seq.unsqueeze(-1).expand(n, t).clone()
    return logprobs, old, adv, mask


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize(("low", "high", "c", "beta1", "beta2"), [
    (0.2, 0.2, 3.0, 0.75, 1.0), (0.2, 0.28, 3.0, 0.5, 1.0), (0.2, 0.2, 10.0, 0.25, 1.5), (0.1, 0.3, 3.0, 0.0, 0.0),
])  # fmt: skip
def test_ce_gppo_matches_the_authors_loss(seed, low, high, c, beta1, beta2):
    logprobs, old, adv, mask = _case(seed)
    ours_lp = logprobs.clone().requires_grad_(True)
    loss, stats = POLICY_LOSSES["ce_gppo"](
        ours_lp, old, adv, mask, clip_ratio_low=low, clip_ratio_high=high, clip_ratio_c=c,
        loss_agg_mode="token-mean", normalizer=None, loss_scale_factor=None, beta1=beta1, beta2=beta2,
    )  # fmt: skip
    loss.backward()
    ref_lp = logprobs.clone().requires_grad_(True)
    ref, clipfrac, lower = _ref_ce_gppo(old, ref_lp, adv, mask.to(F64), low, high, c, beta1, beta2)
    ref.backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ours_lp.grad, ref_lp.grad * mask, rtol=1e-12, atol=1e-14)
    assert float(stats.clip_frac) == pytest.approx(float(clipfrac), abs=1e-14)
    assert float(stats.dual_clip_frac) == pytest.approx(float(lower), abs=1e-14)


@pytest.mark.parametrize("name", ["sapo", "dppo_tv", "dppo_kl", "ce_gppo"])
def test_on_policy_gradient_is_a_grad_log_pi(name):
    """``first_order_entropy=True``: at ratio 1 each loss token's gradient is ``A`` times its aggregation weight."""
    logprobs, old, adv, mask = _case(3)
    lp = old.clone().requires_grad_(True)
    loss, _ = POLICY_LOSSES[name](
        lp, old, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=None, loss_agg_mode="token-mean",
        normalizer=None, loss_scale_factor=None,
    )  # fmt: skip
    loss.backward()
    torch.testing.assert_close(lp.grad, -adv * mask / mask.sum(), rtol=1e-12, atol=1e-15)

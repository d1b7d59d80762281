"""Advantages, policy/value losses and KL estimators against loops, closed forms and finite differences."""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from lit_entropy.functional.advantages import gae_advantages, grpo_advantages, whiten
from lit_entropy.functional.losses import (
    LOSS_AGG_MODES,
    aggregate_loss,
    kl_penalty,
    loss_normalizer_count,
    policy_loss,
    value_loss,
)

# ---------------------------------------------------------------- GRPO advantages


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("group_size", [1, 2, 5])
def test_grpo_advantages_match_loop(scale, group_size):
    g = torch.Generator().manual_seed(group_size)
    rewards = torch.randint(0, 3, (4 * group_size,), generator=g).double() + 0.1 * torch.rand(
        4 * group_size, generator=g, dtype=torch.float64
    )
    rewards[:group_size] = 1.0  # one constant group
    r = rewards.tolist()
    eps = 1e-6
    batch_std = statistics.stdev(r) if len(r) > 1 else 0.0
    expected = []
    for i in range(0, len(r), group_size):
        grp = r[i : i + group_size]
        mean = statistics.fmean(grp)
        for x in grp:
            if max(grp) == min(grp):
                expected.append(0.0)
            elif scale == "group":
                expected.append((x - mean) / (statistics.stdev(grp) + eps))
            elif scale == "batch":
                expected.append((x - mean) / (batch_std + eps))
            else:
                expected.append(x - mean)
    got = grpo_advantages(rewards, group_size, scale=scale, eps=eps)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("value", [0.1, 1.0, 1 / 3, -7.25])
def test_grpo_equal_rewards_give_exact_zeros(value):
    for scale in ("group", "batch", "none"):
        rewards = torch.full((12,), value, dtype=torch.float32)
        for gs in (1, 3, 12):
            out = grpo_advantages(rewards, gs, scale=scale)
            assert torch.equal(out, torch.zeros(12)), (scale, gs)
    # Bool / integer rewards are accepted.
    out = grpo_advantages(torch.tensor([True, False, True, True]), 2)
    assert out[:2].tolist() == pytest.approx([0.5 / (math.sqrt(0.5) + 1e-6), -0.5 / (math.sqrt(0.5) + 1e-6)])
    assert out[2:].tolist() == [0.0, 0.0]


def test_grpo_advantages_validation():
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.zeros(6), 4)
    with pytest.raises(ValueError, match="group_size"):
        grpo_advantages(torch.zeros(6), 0)
    with pytest.raises(ValueError, match="scale"):
        grpo_advantages(torch.zeros(6), 3, scale="std")


# ---------------------------------------------------------------- GAE and whitening


def _ref_gae(rewards, values, mask, gamma, lam):
    """Per row: compress the valid tokens, then A_t = sum_l (gamma lam)^l delta_{t+l} (closed form)."""
    advs, rets = [], []
    for r_row, v_row, m_row in zip(rewards, values, mask, strict=True):
        idx = [t for t, ok in enumerate(m_row) if ok]
        r = [r_row[t] for t in idx]
        v = [v_row[t] for t in idx] + [0.0]
        deltas = [r[i] + gamma * v[i + 1] - v[i] for i in range(len(idx))]
        a_row, ret_row = [0.0] * len(m_row), [0.0] * len(m_row)
        for i, t in enumerate(idx):
            a = sum((gamma * lam) ** j * deltas[i + j] for j in range(len(idx) - i))
            a_row[t], ret_row[t] = a, a + v[i]
        advs.append(a_row)
        rets.append(ret_row)
    return advs, rets


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.5, 0.0), (0.0, 0.7)])
def test_gae_matches_closed_form(gamma, lam):
    g = torch.Generator().manual_seed(0)
    B, T = 5, 9
    values = torch.randn(B, T, generator=g, dtype=torch.float64)
    lengths = torch.tensor([9, 4, 1, 0, 6])
    mask = torch.arange(T) < lengths.unsqueeze(-1)
    rewards = torch.zeros(B, T, dtype=torch.float64)
    for b, n in enumerate(lengths.tolist()):
        if n:
            rewards[b, n - 1] = float(b) - 1.5  # sequence reward at the last valid token
    rewards[0, 2] = 0.3  # plus a dense token reward
    mask[0, 5] = False  # a hole: skipped by the recursion
    adv, ret = gae_advantages(rewards, values, mask, gamma=gamma, lam=lam)
    exp_adv, exp_ret = _ref_gae(rewards.tolist(), values.tolist(), mask.tolist(), gamma, lam)
    for got_row, want_row in zip(adv.tolist(), exp_adv, strict=True):
        assert got_row == pytest.approx(want_row, abs=1e-12)
    for got_row, want_row in zip(ret.tolist(), exp_ret, strict=True):
        assert got_row == pytest.approx(want_row, abs=1e-12)
    with pytest.raises(ValueError, match="gamma"):
        gae_advantages(rewards, values, mask, gamma=1.5)
    with pytest.raises(ValueError, match="lam"):
        gae_advantages(rewards, values, mask, lam=-0.1)


def test_whiten_matches_statistics():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 7, generator=g, dtype=torch.float64) * 3 + 2
    mask = torch.rand(3, 7, generator=g) < 0.7
    vals = x[mask].tolist()
    mean, sd = statistics.fmean(vals), statistics.stdev(vals)
    out = whiten(x, mask)
    out_keep = whiten(x, mask, shift_mean=False)
    for b in range(3):
        for t in range(7):
            if mask[b, t]:
                z = (x[b, t].item() - mean) / math.sqrt(sd**2 + 1e-8)
                assert out[b, t].item() == pytest.approx(z, abs=1e-10)
                assert out_keep[b, t].item() == pytest.approx(z + mean, abs=1e-10)
            else:
                assert out[b, t].item() == 0.0
    one = torch.zeros(1, 3, dtype=torch.bool)
    one[0, 1] = True
    assert whiten(x[:1, :3], one).tolist() == [[0.0, 0.0, 0.0]]


# ---------------------------------------------------------------- policy loss


def _ref_token_loss(lp, old, a, lo, hi, c):
    r = math.exp(lp - old)
    loss = max(-a * r, -a * min(max(r, 1 - lo), 1 + hi))
    if c is not None and a < 0:
        loss = min(loss, -a * c)
    return loss


def _ref_aggregate(loss, mask, mode, normalizer=None):
    rows = [[x for x, m in zip(lr, mr, strict=True) if m] for lr, mr in zip(loss, mask, strict=True)]
    if mode == "token-mean":
        total, count = sum(sum(r) for r in rows), sum(len(r) for r in rows)
    elif mode == "token-sum":
        total, count = sum(sum(r) for r in rows), 1
    else:
        rows = [r for r in rows if r]
        T = len(mask[0])
        per = {
            "seq-mean-token-mean": [sum(r) / len(r) for r in rows],
            "seq-mean-token-sum": [sum(r) for r in rows],
            "seq-mean-token-sum-norm": [sum(r) / T for r in rows],
        }[mode]
        total, count = sum(per), len(per)
    denom = normalizer if normalizer is not None else max(count, 1)
    return total / denom


def _batch(seed, B=4, T=6, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(B, T, generator=g, dtype=dtype) * 3
    old = lp + 0.6 * torch.randn(B, T, generator=g, dtype=dtype)  # ratios well outside [0.8, 1.2] too
    adv = torch.randn(B, T, generator=g, dtype=dtype)
    mask = torch.arange(T) < torch.tensor([T, T - 2, 1, 3][:B] + [T] * max(0, B - 4)).unsqueeze(-1)
    return lp, old, adv, mask


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize(("lo", "hi", "c"), [(0.2, 0.2, None), (0.2, 0.28, None), (0.1, 0.3, 1.5)])
def test_policy_loss_matches_loop(mode, lo, hi, c):
    lp, old, adv, mask = _batch(5)
    loss, stats = policy_loss(
        lp, old, adv, mask, clip_ratio_low=lo, clip_ratio_high=hi, clip_ratio_c=c, loss_agg_mode=mode
    )
    per_tok = [
        [_ref_token_loss(lp[b, t].item(), old[b, t].item(), adv[b, t].item(), lo, hi, c) for t in range(6)]
        for b in range(4)
    ]
    assert loss.item() == pytest.approx(_ref_aggregate(per_tok, mask.tolist(), mode), rel=1e-12)
    # Clip fractions over valid tokens by a loop.
    n = int(mask.sum())
    low = high = dual = 0
    for b, t in mask.nonzero().tolist():
        r, a = math.exp(lp[b, t].item() - old[b, t].item()), adv[b, t].item()
        low += a < 0 and r < 1 - lo
        high += a > 0 and r > 1 + hi
        dual += c is not None and a < 0 and r > c
    assert stats.clip_frac_low.item() == pytest.approx(low / n)
    assert stats.clip_frac_high.item() == pytest.approx(high / n)
    assert stats.clip_frac.item() == pytest.approx((low + high) / n)
    assert stats.dual_clip_frac.item() == pytest.approx(dual / n)
    assert low > 0 and high > 0 and (c is None or dual > 0)
    ratios = [math.exp(lp[b, t].item() - old[b, t].item()) for b, t in mask.nonzero().tolist()]
    assert stats.ratio_mean.item() == pytest.approx(statistics.fmean(ratios))
    assert stats.approx_kl.item() == pytest.approx(statistics.fmean([r - 1 - math.log(r) for r in ratios]))
    assert all(not s.requires_grad for s in stats)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_policy_loss_gradient_matches_finite_differences(mode):
    lp, old, adv, mask = _batch(1, B=3, T=4)
    lp = lp.clone().requires_grad_(True)
    kw = dict(clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=2.0, loss_agg_mode=mode)
    loss, _ = policy_loss(lp, old, adv, mask, **kw)
    (grad,) = torch.autograd.grad(loss, lp)
    h = 1e-6
    for b in range(3):
        for t in range(4):
            r = math.exp(lp[b, t].item() - old[b, t].item())
            kinks = (1 - 0.2, 1 + 0.28, 2.0)
            if any(abs(r - k) < 1e-4 for k in kinks):
                continue
            plus, minus = lp.detach().clone(), lp.detach().clone()
            plus[b, t] += h
            minus[b, t] -= h
            fd = (policy_loss(plus, old, adv, mask, **kw)[0] - policy_loss(minus, old, adv, mask, **kw)[0]) / (2 * h)
            assert grad[b, t].item() == pytest.approx(fd.item(), abs=1e-7)
            if not mask[b, t]:
                assert grad[b, t].item() == 0.0


def test_clipped_tokens_have_zero_gradient_and_garbage_is_ignored():
    # Token 0: A > 0, ratio 1.5 > 1.2 (high clip); token 1: A < 0, ratio 0.5 < 0.8 (low clip);
    # token 2: A < 0, ratio 4 > c = 3 (dual clip); token 3: unclipped; token 4: padding with garbage.
    ratios = torch.tensor([[1.5, 0.5, 4.0, 1.1, 1.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -2.0, -3.0, -0.5, float("nan")]], dtype=torch.float64)
    lp = (old + ratios.log()).clone()
    lp[0, 4] = -float("inf")
    lp.requires_grad_(True)
    adv = torch.tensor([[2.0, -1.0, -0.5, 0.7, float("nan")]], dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False]])
    loss, stats = policy_loss(lp, old, adv, mask, clip_ratio_c=3.0)
    expected = (-2.0 * 1.2 + 1.0 * 0.8 + 0.5 * 3.0 - 0.7 * 1.1) / 4
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    loss.backward()
    assert lp.grad[0, :3].tolist() == [0.0, 0.0, 0.0]
    assert lp.grad[0, 3].item() == pytest.approx(-0.7 * 1.1 / 4, rel=1e-12)
    assert lp.grad[0, 4].item() == 0.0
    assert stats.clip_frac_low.item() == 0.25 and stats.clip_frac_high.item() == 0.25
    assert stats.clip_frac.item() == 0.5 and stats.dual_clip_frac.item() == 0.25


def test_per_sequence_advantages_broadcast():
    lp, old, adv, mask = _batch(2)
    seq_adv = adv[:, 0]
    a, sa = policy_loss(lp, old, seq_adv.unsqueeze(-1).expand_as(lp), mask)
    b, sb = policy_loss(lp, old, seq_adv, mask)
    assert a.item() == b.item() and sa.clip_frac.item() == sb.clip_frac.item()


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_normalizer_reproduces_full_batch(mode):
    lp, old, adv, mask = _batch(3, B=4, T=6)
    mask[3] = False  # an empty sequence: not counted by the seq-mean modes
    full, _ = policy_loss(lp, old, adv, mask, loss_agg_mode=mode)
    norm = {"token-mean": float(mask.sum()), "token-sum": 1.0}.get(mode, float(mask.any(-1).sum()))
    assert float(loss_normalizer_count(mask, mode)) == norm
    halves = [slice(0, 1), slice(1, 4)]
    parts = [policy_loss(lp[s], old[s], adv[s], mask[s], loss_agg_mode=mode, normalizer=norm)[0] for s in halves]
    assert (parts[0] + parts[1]).item() == pytest.approx(full.item(), rel=1e-12)
    # A tensor normalizer works the same.
    t_norm = torch.tensor(norm)
    parts_t = [policy_loss(lp[s], old[s], adv[s], mask[s], loss_agg_mode=mode, normalizer=t_norm)[0] for s in halves]
    assert (parts_t[0] + parts_t[1]).item() == pytest.approx(full.item(), rel=1e-12)


def test_aggregate_loss_scale_factor_and_empty():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = torch.tensor([[True, True, False], [True, False, False]])
    assert aggregate_loss(x, m, "seq-mean-token-sum-norm", loss_scale_factor=10.0).item() == pytest.approx(
        (3 / 10 + 4 / 10) / 2
    )
    for mode in LOSS_AGG_MODES:
        assert aggregate_loss(x, torch.zeros_like(m), mode).item() == 0.0


def test_policy_loss_validation():
    lp, old, adv, mask = _batch(0)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        policy_loss(lp, old, adv, mask, loss_agg_mode="sum")
    with pytest.raises(ValueError, match="clip_ratio_low"):
        policy_loss(lp, old, adv, mask, clip_ratio_low=-0.1)
    with pytest.raises(ValueError, match=r"clip_ratio_low must be a number in \[0, 1\), got 1.5"):
        policy_loss(lp, old, adv, mask, clip_ratio_low=1.5)
    with pytest.raises(ValueError, match="clip_ratio_high"):
        policy_loss(lp, old, adv, mask, clip_ratio_high=-0.1)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        policy_loss(lp, old, adv, mask, clip_ratio_c=1.0)
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, old, adv[:, :2], mask)
    with pytest.raises(ValueError, match="normalizer"):
        policy_loss(lp, old, adv, mask, normalizer=0)


# ---------------------------------------------------------------- value loss


@pytest.mark.parametrize("clip", [0.2, None])
def test_value_loss_matches_formula(clip):
    g = torch.Generator().manual_seed(4)
    v = torch.randn(3, 5, generator=g, dtype=torch.float64).requires_grad_(True)
    old = v.detach() + 0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64)
    ret = torch.randn(3, 5, generator=g, dtype=torch.float64)
    mask = torch.arange(5) < torch.tensor([[5], [2], [4]])
    loss, frac = value_loss(v, old, ret, mask, clip_range_value=clip)
    terms, clipped = [], 0
    for b, t in mask.nonzero().tolist():
        vv, oo, rr = v[b, t].item(), old[b, t].item(), ret[b, t].item()
        plain = (vv - rr) ** 2
        if clip is None:
            terms.append(plain)
            continue
        vc = min(max(vv, oo - clip), oo + clip)
        terms.append(max(plain, (vc - rr) ** 2))
        clipped += (vc - rr) ** 2 > plain
    assert loss.item() == pytest.approx(0.5 * statistics.fmean(terms), rel=1e-12)
    assert frac.item() == pytest.approx(clipped / len(terms))
    if clip is not None:
        assert 0 < clipped < len(terms)
    with pytest.raises(ValueError, match="clip_range_value"):
        value_loss(v, old, ret, mask, clip_range_value=-1.0)


# ---------------------------------------------------------------- KL estimators


def test_kl_penalty_closed_forms_and_aliases():
    lp = torch.tensor([-1.0, -0.2, -3.0, -2.0], dtype=torch.float64)
    ref = torch.tensor([-1.5, -0.1, -2.0, -2.0], dtype=torch.float64)
    for kind in ("k1", "kl"):
        assert kl_penalty(lp, ref, kind).tolist() == pytest.approx([0.5, -0.1, -1.0, 0.0])
    for kind in ("k2", "mse"):
        assert kl_penalty(lp, ref, kind).tolist() == pytest.approx([0.125, 0.005, 0.5, 0.0])
    k3 = [math.exp(d) - d - 1 for d in (-0.5, 0.1, 1.0, 0.0)]
    for kind in ("k3", "low_var_kl"):
        assert kl_penalty(lp, ref, kind).tolist() == pytest.approx(k3, rel=1e-12)
    assert kl_penalty(lp, ref, "abs").tolist() == pytest.approx([0.5, 0.1, 1.0, 0.0])
    with pytest.raises(ValueError, match="kind"):
        kl_penalty(lp, ref, "k4")


def test_kl_penalty_properties():
    g = torch.Generator().manual_seed(6)
    lp = -torch.rand(200, generator=g, dtype=torch.float64) * 5
    ref = -torch.rand(200, generator=g, dtype=torch.float64) * 5
    assert (kl_penalty(lp, ref, "k3") >= 0).all()
    assert (kl_penalty(lp, ref, "k2") >= 0).all()
    for kind in ("k1", "k2", "k3", "abs", "kl", "mse", "low_var_kl", "k3+"):
        assert torch.equal(kl_penalty(lp, lp, kind), torch.zeros_like(lp))
    # verl's low_var_kl clamp: the value is at most 10 (ref far above the policy).
    assert kl_penalty(torch.tensor([-20.0]), torch.tensor([-1.0]), "k3").item() == 10.0


def test_k3_and_k1_expectations_equal_exact_kl():
    p = torch.tensor([0.1, 0.2, 0.3, 0.15, 0.25], dtype=torch.float64)
    q = torch.tensor([0.3, 0.1, 0.2, 0.25, 0.15], dtype=torch.float64)
    exact = sum(pi * math.log(pi / qi) for pi, qi in zip(p.tolist(), q.tolist(), strict=True))
    k3 = kl_penalty(p.log(), q.log(), "k3")
    k1 = kl_penalty(p.log(), q.log(), "k1")
    assert (p * k3).sum().item() == pytest.approx(exact, rel=1e-12)
    assert (p * k1).sum().item() == pytest.approx(exact, rel=1e-12)


def test_straight_through_kind_has_k2_gradient():
    lp = torch.tensor([-1.0, -0.5, -2.0], dtype=torch.float64, requires_grad=True)
    ref = torch.tensor([-1.3, -0.1, -2.0], dtype=torch.float64)
    out = kl_penalty(lp, ref, "k3+")
    assert out.tolist() == pytest.approx([math.exp(d) - d - 1 for d in (-0.3, 0.4, 0.0)], rel=1e-12)
    out.sum().backward()
    assert lp.grad.tolist() == pytest.approx([0.3, -0.4, 0.0], rel=1e-12)  # d/dlp 0.5 (lp - ref)^2


def test_policy_loss_upcasts_low_precision_inputs():
    lp, old, adv, mask = _batch(2, dtype=torch.float32)
    lp16 = lp.to(torch.bfloat16).requires_grad_(True)
    loss, _ = policy_loss(lp16, old.to(torch.bfloat16), adv.to(torch.bfloat16), mask)
    assert loss.dtype == torch.float32
    loss.backward()
    assert lp16.grad is not None and lp16.grad.dtype == torch.bfloat16 and torch.isfinite(lp16.grad).all()
    lp_l, old_l, adv_l = (x.to(torch.bfloat16).double().tolist() for x in (lp, old, adv))
    per_tok = [
        [_ref_token_loss(lp_l[b][t], old_l[b][t], adv_l[b][t], 0.2, 0.2, None) for t in range(6)] for b in range(4)
    ]
    assert loss.item() == pytest.approx(_ref_aggregate(per_tok, mask.tolist(), "token-mean"), rel=1e-5)

"""GSPO, GSPO-token, CISPO and GMPO against float64 loops written from their papers' formulas.

Each reference is built per sequence and per token with Python loops (the loss as a torch scalar, so
autograd gives the reference gradient, or the gradient written out by hand); the cases have masks,
all-masked rows, rows a callback masked entirely, ratios exactly 1 and tied advantages. Under the
sequence-level losses a token the loss mask drops stays in its sequence's ratio *value* and gets no
gradient (``policy_losses_sequence``'s docstring says why); their gradients are written out by hand.
"""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional import (
    POLICY_LOSSES,
    PolicyLossStats,
    cispo_policy_loss,
    gmpo_policy_loss,
    gspo_policy_loss,
    gspo_token_policy_loss,
)

MODES = ("seq-mean-token-mean", "token-mean")
ALL_MODES = ("token-mean", "token-sum", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm")


def make_case(seed: int, n: int = 6, t: int = 7, spread: float = 0.3):
    """``(logprobs, old, seq_adv [N], mask, response)`` in float64 with the edge rows the tests need."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(n, t, generator=g, dtype=torch.float64) * 3 - 0.05
    logprobs = old + spread * torch.randn(n, t, generator=g, dtype=torch.float64)
    response = torch.rand(n, t, generator=g) < 0.8
    response[:, 0] = True
    response[0] = False  # an empty row
    mask = response & (torch.rand(n, t, generator=g) < 0.75)
    mask[1] = False  # a row a callback masked entirely (its tokens are still valid response tokens)
    logprobs[2] = old[2]  # ratio exactly 1 on every token
    adv = torch.randn(n, generator=g, dtype=torch.float64)
    adv[3] = adv[4]  # tied advantages
    adv[5] = 0.0
    return logprobs.clone().requires_grad_(True), old, adv, mask, response


def aggregate_ref(per_token: list[list], mask: torch.Tensor, mode: str):
    """Aggregate ``per_token[i][t]`` (torch scalars) over ``mask`` by the mode's definition."""
    rows = [[per_token[i][t] for t in range(mask.shape[1]) if mask[i, t]] for i in range(mask.shape[0])]
    rows = [row for row in rows if row]
    if mode == "token-mean":
        return sum(sum(row) for row in rows) / sum(len(row) for row in rows)
    return sum(sum(row) / len(row) for row in rows) / len(rows)


def call(fn, logprobs, old, adv, mask, response, mode, low, high):
    return fn(
        logprobs,
        old,
        adv,
        mask,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=3.0,
        loss_agg_mode=mode,
        normalizer=None,
        loss_scale_factor=None,
        response_mask=response,
    )


def grad_of(loss, logprobs):
    (grad,) = torch.autograd.grad(loss, logprobs)
    return grad


def seq_ratio_ref(logprobs, old, response, i):
    idx = [t for t in range(logprobs.shape[1]) if response[i, t]]
    return torch.exp(sum(logprobs[i, t] - old[i, t] for t in idx) / len(idx))


def sequence_weights_ref(mask, mode: str) -> list[float]:
    """``W_i``: the summed aggregation weights of row ``i``'s loss tokens (``seq-mean-token-mean``, ``token-mean``)."""
    rows = [i for i in range(mask.shape[0]) if mask[i].any()]
    total = mask.sum().item()
    return [
        (mask[i].sum().item() / total if mode == "token-mean" else 1 / len(rows)) if i in rows else 0.0
        for i in range(mask.shape[0])
    ]


def token_frac_ref(flags: list[list[bool]], mask) -> float:
    picked = [flags[i][t] for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    return sum(picked) / len(picked)


# ------------------------------------------------------------------------------------------- GSPO


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_matches_the_sequence_ratio_formula(seed, mode):
    low, high = 0.02, 0.03  # small ranges as the paper (3e-4 / 4e-4 at its scale), binding on some rows
    logprobs, old, adv, mask, response = make_case(seed, spread=0.05)
    loss, stats = call(gspo_policy_loss, logprobs, old, adv, mask, response, mode, low, high)

    n, t = mask.shape
    per_token, clip_low, clip_high = [], [], []
    weights, expected = sequence_weights_ref(mask, mode), torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        if response[i].any():
            s = seq_ratio_ref(logprobs, old, response, i).item()  # over every valid token, masked ones too
            a = adv[i].item()
            li = max(-a * s, -a * min(max(s, 1 - low), 1 + high))
            lo_i, hi_i = s < 1 - low and a < 0, s > 1 + high and a > 0
            kept = mask[i].sum().item()
            for k in range(t):  # d l_i / d log pi_ik = -A s / |loss tokens| on loss tokens, 0 once clipped
                if mask[i, k] and not (lo_i or hi_i):
                    expected[i, k] = weights[i] * (-a * s / kept)
        else:
            li, lo_i, hi_i = 0.0, False, False
        per_token.append([torch.tensor(li, dtype=torch.float64)] * t)
        clip_low.append([lo_i] * t)
        clip_high.append([hi_i] * t)
    ref = aggregate_ref(per_token, mask, mode)
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_of(loss, logprobs), expected, rtol=1e-10, atol=1e-14)
    assert stats.clip_frac_low.item() == pytest.approx(token_frac_ref(clip_low, mask))
    assert stats.clip_frac_high.item() == pytest.approx(token_frac_ref(clip_high, mask))
    assert stats.dual_clip_frac.item() == 0.0


def test_sequence_losses_masked_tokens_keep_the_ratio_value_and_get_no_gradient():
    logprobs, old, adv, mask, response = make_case(3)
    rows = [i for i in range(mask.shape[0]) if mask[i].any() and (response[i] & ~mask[i]).any() and adv[i] != 0]
    assert rows
    for fn in (gspo_policy_loss, gmpo_policy_loss):
        loss, _ = call(fn, logprobs, old, adv, mask, response, "seq-mean-token-mean", 0.99, 100.0)
        grad = grad_of(loss, logprobs)
        assert torch.all(grad[~mask] == 0)  # padding and masked valid tokens alike
        for row in rows:
            assert torch.all(grad[row][mask[row]] != 0)
        # moving a masked valid token's log-prob moves the loss (it is in the ratio's value)
        moved = logprobs.detach().clone()
        masked_valid = response & ~mask
        moved[masked_valid] += 0.1
        shifted, _ = call(fn, moved, old, adv, mask, response, "seq-mean-token-mean", 0.99, 100.0)
        assert abs(shifted.item() - loss.item()) > 1e-6


@pytest.mark.parametrize("mode", ALL_MODES)
def test_gspo_equals_gspo_token_under_callback_masks_for_sequence_advantages(mode):
    logprobs, old, adv, mask, response = make_case(11, spread=0.05)
    assert (response & ~mask).any()
    seq, _ = call(gspo_policy_loss, logprobs, old, adv, mask, response, mode, 0.02, 0.03)
    tok, _ = call(gspo_token_policy_loss, logprobs, old, adv, mask, response, mode, 0.02, 0.03)
    torch.testing.assert_close(tok, seq, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_of(tok, logprobs), grad_of(seq, logprobs), rtol=1e-10, atol=1e-14)


def test_gspo_clip_removes_the_gradient_of_clipped_sequences():
    logprobs = torch.tensor([[0.5, 0.5], [-0.5, -0.5]], dtype=torch.float64, requires_grad=True)
    old = torch.zeros(2, 2, dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.bool)
    adv = torch.tensor([1.0, -1.0], dtype=torch.float64)
    loss, stats = call(gspo_policy_loss, logprobs, old, adv, mask, mask, "seq-mean-token-mean", 3e-4, 4e-4)
    # s = e^0.5 > 1 + 4e-4 with A > 0 and s = e^-0.5 < 1 - 3e-4 with A < 0: both clipped.
    assert loss.item() == pytest.approx(0.5 * (-(1 + 4e-4) + (1 - 3e-4)))
    assert torch.all(grad_of(loss, logprobs) == 0)
    assert stats.clip_frac_high.item() == 0.5 and stats.clip_frac_low.item() == 0.5 and stats.clip_frac.item() == 1.0


# ------------------------------------------------------------------------------------- GSPO-token


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gspo_token_matches_its_value_and_hand_written_gradient(seed, mode):
    low, high = 0.02, 0.03
    logprobs, old, seq_adv, mask, response = make_case(seed, spread=0.05)
    g = torch.Generator().manual_seed(100 + seed)
    adv = seq_adv.unsqueeze(-1) + 0.5 * torch.randn(mask.shape, generator=g, dtype=torch.float64)  # token-level
    loss, stats = call(gspo_token_policy_loss, logprobs, old, adv, mask, response, mode, low, high)

    n, t = mask.shape
    values, active, clip_low, clip_high = [], [], [], []
    for i in range(n):
        s = seq_ratio_ref(logprobs, old, response, i).item() if response[i].any() else 1.0
        row_v, row_a, row_l, row_h = [], [], [], []
        for k in range(t):
            a = adv[i, k].item()
            row_v.append(max(-a * s, -a * min(max(s, 1 - low), 1 + high)))
            lo_k, hi_k = s < 1 - low and a < 0, s > 1 + high and a > 0
            row_l.append(lo_k)
            row_h.append(hi_k)
            row_a.append(0.0 if (lo_k or hi_k) else -a * s)  # d loss_it / d log pi_it
        values.append([torch.tensor(v, dtype=torch.float64) for v in row_v])
        active.append(row_a)
        clip_low.append(row_l)
        clip_high.append(row_h)
    torch.testing.assert_close(loss.detach(), aggregate_ref(values, mask, mode), rtol=1e-12, atol=1e-14)
    # The aggregation weight of each token times its own derivative; no gradient off the loss mask.
    weights = torch.zeros(n, t, dtype=torch.float64)
    rows = [i for i in range(n) if mask[i].any()]
    for i in rows:
        for k in range(t):
            if mask[i, k]:
                count = mask.sum().item() if mode == "token-mean" else len(rows) * mask[i].sum().item()
                weights[i, k] = 1 / count
    expected = weights * torch.tensor(active, dtype=torch.float64)
    torch.testing.assert_close(grad_of(loss, logprobs), expected, rtol=1e-10, atol=1e-14)
    assert stats.clip_frac_low.item() == pytest.approx(token_frac_ref(clip_low, mask))
    assert stats.clip_frac_high.item() == pytest.approx(token_frac_ref(clip_high, mask))


@pytest.mark.parametrize("seed", [0, 4])
def test_gspo_token_equals_gspo_for_sequence_advantages_on_full_masks(seed):
    logprobs, old, adv, _, response = make_case(seed, spread=0.05)
    seq, _ = call(gspo_policy_loss, logprobs, old, adv, response, response, "seq-mean-token-mean", 0.02, 0.03)
    tok, _ = call(gspo_token_policy_loss, logprobs, old, adv, response, response, "seq-mean-token-mean", 0.02, 0.03)
    torch.testing.assert_close(tok, seq, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_of(tok, logprobs), grad_of(seq, logprobs), rtol=1e-10, atol=1e-14)


# ------------------------------------------------------------------------------------------- CISPO


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cispo_matches_the_clipped_weight_reinforce_formula(seed, mode):
    low, high = 0.2, 0.28
    logprobs, old, seq_adv, mask, response = make_case(seed, spread=0.4)
    loss, stats = call(cispo_policy_loss, logprobs, old, seq_adv, mask, response, mode, low, high)

    n, t = mask.shape
    values, grads, clip_low, clip_high = [], torch.zeros(n, t, dtype=torch.float64), [], []
    rows = [i for i in range(n) if mask[i].any()]
    for i in range(n):
        row_v, row_l, row_h = [], [], []
        for k in range(t):
            r = math.exp(logprobs[i, k].item() - old[i, k].item())
            w = min(max(r, 1 - low), 1 + high)
            a = seq_adv[i].item()
            row_v.append(torch.tensor(-w * a * logprobs[i, k].item(), dtype=torch.float64))
            row_l.append(r < 1 - low)
            row_h.append(r > 1 + high)
            if mask[i, k]:
                weight = 1 / mask.sum().item() if mode == "token-mean" else 1 / (len(rows) * mask[i].sum().item())
                grads[i, k] = weight * (-w * a)  # every token keeps its gradient, only its weight is capped
        values.append(row_v)
        clip_low.append(row_l)
        clip_high.append(row_h)
    torch.testing.assert_close(loss.detach(), aggregate_ref(values, mask, mode), rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_of(loss, logprobs), grads, rtol=1e-10, atol=1e-14)
    assert stats.clip_frac_low.item() == pytest.approx(token_frac_ref(clip_low, mask))
    assert stats.clip_frac_high.item() == pytest.approx(token_frac_ref(clip_high, mask))
    assert 0 < stats.clip_frac.item() < 1  # the case does cut some weights


def test_cispo_gradient_equals_the_unclipped_surrogate_inside_the_range():
    logprobs, old, adv, mask, response = make_case(5, spread=0.01)  # every ratio within [0.8, 1.28]
    cispo, stats = call(cispo_policy_loss, logprobs, old, adv, mask, response, "token-mean", 0.2, 0.28)
    ppo, _ = call(POLICY_LOSSES["ppo"], logprobs, old, adv, mask, response, "token-mean", 0.2, 0.28)
    assert stats.clip_frac.item() == 0
    torch.testing.assert_close(grad_of(cispo, logprobs), grad_of(ppo, logprobs), rtol=1e-10, atol=1e-14)


# -------------------------------------------------------------------------------------------- GMPO


def gmpo_sequence_ref(logprobs, old, a, response, i, low, high):
    """The paper's ``sgn(A) prod_t |min(r A, clip(r, e^-low, e^high) A)|^(1/|o|)`` (to maximise)."""
    if a == 0:
        return torch.zeros((), dtype=torch.float64)
    idx = [t for t in range(logprobs.shape[1]) if response[i, t]]
    product = torch.ones((), dtype=torch.float64)
    for t in idx:
        r = torch.exp(logprobs[i, t] - old[i, t])
        product = product * torch.abs(torch.minimum(r * a, torch.clamp(r, math.exp(-low), math.exp(high)) * a))
    return math.copysign(1.0, a) * product ** (1.0 / len(idx))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gmpo_matches_the_geometric_mean_formula(seed, mode):
    low, high = 0.4, 0.4
    logprobs, old, adv, mask, response = make_case(seed, spread=0.5)
    loss, stats = call(gmpo_policy_loss, logprobs, old, adv, mask, response, mode, low, high)

    n, t = mask.shape
    per_token, clip_low, clip_high = [], [], []
    weights, expected = sequence_weights_ref(mask, mode), torch.zeros(n, t, dtype=torch.float64)
    for i in range(n):
        a = adv[i].item()
        value = gmpo_sequence_ref(logprobs, old, a, response, i, low, high).item() if response[i].any() else 0.0
        per_token.append([torch.tensor(-value, dtype=torch.float64)] * t)
        log_r = [(logprobs[i, k] - old[i, k]).item() for k in range(t)]
        clip_low.append([a < 0 and lr < -low for lr in log_r])
        clip_high.append([a > 0 and lr > high for lr in log_r])
        # l_i = -A exp(G_i) = -value; d l_i / d log pi_ik = -value / |loss tokens| where the token's own
        # log-ratio is the pessimistic side (not clipped), 0 elsewhere and off the loss mask
        for k in range(t):
            if mask[i, k] and not (clip_low[i][k] or clip_high[i][k]) and a != 0:
                expected[i, k] = weights[i] * (-value / mask[i].sum().item())
    ref = aggregate_ref(per_token, mask, mode)
    torch.testing.assert_close(loss.detach(), ref, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(grad_of(loss, logprobs), expected, rtol=1e-10, atol=1e-14)
    assert stats.clip_frac_low.item() == pytest.approx(token_frac_ref(clip_low, mask))
    assert stats.clip_frac_high.item() == pytest.approx(token_frac_ref(clip_high, mask))
    assert stats.clip_frac.item() > 0  # the case does clip


def test_gmpo_with_constant_token_advantages_equals_sequence_advantages():
    logprobs, old, adv, mask, response = make_case(6, spread=0.5)
    seq, _ = call(gmpo_policy_loss, logprobs, old, adv, mask, response, "token-mean", 0.4, 0.4)
    tok_adv = adv.unsqueeze(-1).expand(mask.shape).contiguous()
    tok, _ = call(gmpo_policy_loss, logprobs, old, tok_adv, mask, response, "token-mean", 0.4, 0.4)
    torch.testing.assert_close(tok, seq, rtol=1e-12, atol=1e-14)


# ------------------------------------------------------------------------------------------ common


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo", "gmpo"])
def test_registered_losses_ignore_padding_garbage_and_return_policy_loss_stats(name):
    logprobs, old, adv, mask, response = make_case(7)
    clean, _ = call(POLICY_LOSSES[name], logprobs, old, adv, mask, response, "token-mean", 0.2, 0.28)
    dirty_lp = torch.where(response, logprobs.detach(), torch.tensor(float("nan"), dtype=torch.float64))
    dirty_lp.requires_grad_(True)
    dirty_old = torch.where(response, old, torch.tensor(float("inf"), dtype=torch.float64))
    dirty, stats = call(POLICY_LOSSES[name], dirty_lp, dirty_old, adv, mask, response, "token-mean", 0.2, 0.28)
    torch.testing.assert_close(dirty, clean.detach())
    assert torch.isfinite(grad_of(dirty, dirty_lp)).all()
    assert isinstance(stats, PolicyLossStats) and all(torch.isfinite(v) for v in stats)
    assert stats.approx_kl.item() >= 0


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo", "gmpo"])
def test_an_all_masked_batch_gives_zero_loss_and_stats(name):
    logprobs, old, adv, mask, response = make_case(8)
    nothing = torch.zeros_like(mask)
    loss, stats = call(POLICY_LOSSES[name], logprobs, old, adv, nothing, response, "token-mean", 0.2, 0.2)
    assert loss.item() == 0 and stats.clip_frac.item() == 0 and stats.ratio_mean.item() == 0
    assert torch.all(grad_of(loss, logprobs) == 0)


@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo", "gmpo"])
def test_registered_losses_refuse_bad_arguments(name):
    logprobs, old, adv, mask, response = make_case(9)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        call(POLICY_LOSSES[name], logprobs, old, adv, mask, response, "mean", 0.2, 0.2)
    with pytest.raises(ValueError, match="clip_ratio_low"):
        call(POLICY_LOSSES[name], logprobs, old, adv, mask, response, "token-mean", 1.5, 0.2)
    with pytest.raises(ValueError, match="advantages shape"):
        call(POLICY_LOSSES[name], logprobs, old, adv[:3], mask, response, "token-mean", 0.2, 0.2)


def test_float32_inputs_give_float32_losses_close_to_float64():
    logprobs, old, adv, mask, response = make_case(10)
    for name in ("gspo", "gspo_token", "cispo", "gmpo"):
        ref, _ = call(POLICY_LOSSES[name], logprobs.detach(), old, adv, mask, response, "token-mean", 0.2, 0.28)
        lp32, old32, adv32 = logprobs.detach().float(), old.float(), adv.float()
        low, _ = call(POLICY_LOSSES[name], lp32, old32, adv32, mask, response, "token-mean", 0.2, 0.28)
        assert low.dtype == torch.float32
        assert low.item() == pytest.approx(ref.item(), rel=1e-5, abs=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("name", ["ppo", "gspo", "gspo_token", "gmpo", "cispo"])
def test_first_order_losses_give_each_loss_token_a_grad_log_pi_on_policy(name, mode):
    """What ``first_order_entropy=True`` promises (the dynamics monitor's formula): at ratio 1 every loss token
    gets ``-A_i`` times its aggregation weight, a masked token nothing."""
    assert POLICY_LOSSES.attributes(name)["first_order_entropy"]
    _, old, adv, mask, response = make_case(12)
    logprobs = old.clone().requires_grad_(True)  # on-policy: every ratio is 1
    loss, _ = call(POLICY_LOSSES[name], logprobs, old, adv, mask, response, mode, 0.2, 0.28)
    rows = [i for i in range(mask.shape[0]) if mask[i].any()]
    expected = torch.zeros(mask.shape, dtype=torch.float64)
    for i in rows:
        for k in range(mask.shape[1]):
            if mask[i, k]:
                count = mask.sum().item() if mode == "token-mean" else len(rows) * mask[i].sum().item()
                expected[i, k] = -adv[i].item() / count
    torch.testing.assert_close(grad_of(loss, logprobs), expected, rtol=1e-10, atol=1e-14)

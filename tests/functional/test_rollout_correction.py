"""Rollout correction weights and mismatch metrics against a float64 loop re-derivation, and the weights in the
registered policy losses against the unweighted per-token loss times the weight."""

from __future__ import annotations

import math

import pytest
import torch

from lit_entropy.functional.losses import aggregate_loss
from lit_entropy.functional.registry import POLICY_LOSSES, policy_loss_takes_token_weights
from lit_entropy.functional.rollout_correction import (
    ROLLOUT_CORRECTION_LEVELS,
    ROLLOUT_CORRECTION_MODES,
    check_rollout_correction_args,
    mismatch_metrics,
    mismatch_sums,
    rollout_correction,
)


def _batch(seed: int = 0):
    """Hand-built pairs: row 0 agrees exactly, row 1 sits below (trainer lower by ~0.5 nats), row 2 far (above and
    below), row 3 all-masked with garbage in it, row 4 a single token above."""
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 3
    trainer = rollout.clone()
    trainer[1] += torch.randn(6, generator=g, dtype=torch.float64) * 0.05 - 0.5
    trainer[2] += torch.tensor([1.5, -2.0, 0.3, 2.5, -0.1, 0.0], dtype=torch.float64)
    trainer[3] = float("nan")
    trainer[4, 0] += 0.9
    mask = torch.tensor(
        [[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 0], [0] * 6, [1, 0, 0, 0, 0, 0]], dtype=torch.bool
    )
    return trainer, rollout, mask


def _reference(trainer, rollout, mask, level, mode, upper, lower):
    """Per-token weights by loops over Python floats (math.exp, explicit sums)."""
    rows, width = mask.shape
    out = [[0.0] * width for _ in range(rows)]
    raw_out = [[0.0] * width for _ in range(rows)]
    for i in range(rows):
        valid = [t for t in range(width) if mask[i, t]]
        diffs = {t: float(trainer[i, t]) - float(rollout[i, t]) for t in valid}
        for t in valid:
            if level == "token":
                log_w = diffs[t]
            elif level == "sequence":
                log_w = sum(diffs.values())
            else:
                log_w = sum(diffs.values()) / len(valid)
            w = math.exp(min(max(log_w, -20.0), 20.0))
            raw_out[i][t] = w
            if mode == "truncate":
                out[i][t] = min(w, upper)
            else:
                out[i][t] = w if lower <= w <= upper else 0.0
    return torch.tensor(out, dtype=torch.float64), torch.tensor(raw_out, dtype=torch.float64)


@pytest.mark.parametrize("level", ROLLOUT_CORRECTION_LEVELS)
@pytest.mark.parametrize("mode", ROLLOUT_CORRECTION_MODES)
@pytest.mark.parametrize(("upper", "lower"), [(2.0, None), (1.5, 0.8), (1.01, 0.0)])
def test_weights_match_a_float64_loop_for_every_level_and_mode(level, mode, upper, lower):
    trainer, rollout, mask = _batch()
    out = rollout_correction(trainer, rollout, mask, level=level, mode=mode, upper=upper, lower=lower)
    low = (1.0 / upper) if lower is None else lower
    expected, raw = _reference(trainer, rollout, mask, level, mode, upper, low)
    torch.testing.assert_close(out.weights, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(out.raw, raw, rtol=1e-12, atol=0)
    assert not out.weights[3].any() and not out.above[3].any() and not out.below[3].any(), "all-masked row"
    torch.testing.assert_close(out.above, mask & (raw > upper))
    torch.testing.assert_close(out.below, mask & (raw < low))
    # float32 inputs give the same weights to float32 precision
    out32 = rollout_correction(trainer.float(), rollout.float(), mask, level=level, mode=mode, upper=upper, lower=lower)
    assert out32.weights.dtype == torch.float32
    torch.testing.assert_close(out32.weights.double(), expected, rtol=2e-5, atol=1e-6)


def test_sequence_weights_are_clamped_before_exp():
    rollout = torch.full((1, 40), -5.0)
    trainer = torch.zeros(1, 40)  # sum of log-ratios 200: exp would overflow float32
    out = rollout_correction(trainer, rollout, torch.ones(1, 40, dtype=torch.bool), level="sequence", upper=3.0)
    assert torch.isfinite(out.raw).all() and out.raw[0, 0] == pytest.approx(math.exp(20.0), rel=1e-6)
    assert (out.weights == 3.0).all() and out.above.all()


def _metrics_reference(trainer, rollout, mask, weights, above, below, level):
    tokens = [(i, t) for i in range(mask.shape[0]) for t in range(mask.shape[1]) if mask[i, t]]
    d = {(i, t): float(rollout[i, t]) - float(trainer[i, t]) for i, t in tokens}
    k1 = sum(d.values()) / len(tokens)
    k3 = sum(math.exp(-x) - 1 + x for x in d.values()) / len(tokens)
    rows = sorted({i for i, _ in tokens})
    ppl = []
    for i in rows:
        mine = [d[(j, t)] for j, t in tokens if j == i]
        ppl_rollout = math.exp(-sum(float(rollout[i, t]) for j, t in tokens if j == i) / len(mine))
        ppl_trainer = math.exp(-sum(float(trainer[i, t]) for j, t in tokens if j == i) / len(mine))
        ppl.append(ppl_rollout / ppl_trainer)
    units = tokens if level == "token" else [(i, min(t for j, t in tokens if j == i)) for i in rows]
    w = [float(weights[u]) for u in units]
    ess = sum(w) ** 2 / (len(w) * sum(x * x for x in w))
    return {
        "kl_k1": k1,
        "kl_k3": k3,
        "ppl_ratio": sum(ppl) / len(ppl),
        "ess": ess,
        "frac_above": sum(bool(above[u]) for u in units) / len(units),
        "frac_below": sum(bool(below[u]) for u in units) / len(units),
    }


@pytest.mark.parametrize("level", ROLLOUT_CORRECTION_LEVELS)
@pytest.mark.parametrize("mode", ROLLOUT_CORRECTION_MODES)
def test_mismatch_metrics_match_a_float64_loop(level, mode):
    trainer, rollout, mask = _batch(1)
    out = rollout_correction(trainer, rollout, mask, level=level, mode=mode, upper=1.5, lower=0.7)
    got = mismatch_metrics(mismatch_sums(trainer, rollout, mask, out, level=level))
    want = _metrics_reference(trainer, rollout, mask, out.weights, out.above, out.below, level)
    assert got == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert got["kl_k3"] > 0 and got["frac_above"] > 0 and got["frac_below"] > 0


def test_mismatch_sums_add_up_across_shards():
    trainer, rollout, mask = _batch(2)
    out = rollout_correction(trainer, rollout, mask, level="geometric", mode="mask", upper=1.5)
    whole = mismatch_sums(trainer, rollout, mask, out, level="geometric")
    parts = [
        mismatch_sums(trainer[s], rollout[s], mask[s], type(out)(*(x[s] for x in out)), level="geometric")
        for s in (slice(0, 2), slice(2, 5))
    ]
    torch.testing.assert_close(parts[0] + parts[1], whole, rtol=1e-12, atol=1e-12)


def test_agreeing_engines_give_zero_mismatch_and_full_ess():
    _, rollout, mask = _batch()
    metrics = mismatch_metrics(mismatch_sums(rollout.clone(), rollout, mask))
    assert metrics == {"kl_k1": 0.0, "kl_k3": 0.0, "ppl_ratio": 1.0, "ess": 1.0, "frac_above": 0.0, "frac_below": 0.0}
    nothing = torch.zeros_like(mask)
    assert mismatch_metrics(mismatch_sums(rollout, rollout, nothing))["ess"] == 1.0


def test_everything_masked_leaves_no_effective_sample():
    trainer, rollout, mask = _batch()
    out = rollout_correction(trainer + 5.0, rollout, mask, level="token", mode="mask", upper=2.0)
    assert not out.weights.any()
    assert mismatch_metrics(mismatch_sums(trainer + 5.0, rollout, mask, out))["ess"] == 0.0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"level": "tok", "mode": "mask", "upper": 2.0}, r"x.level must be one of .*got 'tok'"),
        ({"level": "token", "mode": "clip", "upper": 2.0}, r"x.mode must be one of .*got 'clip'"),
        ({"level": "token", "mode": "mask", "upper": 0.0}, r"x.upper must be a finite number > 0, got 0.0"),
        ({"level": "token", "mode": "mask", "upper": 2.0, "lower": 3.0}, r"x.lower \(upper=2.0\) .* got 3.0"),
    ],
)
def test_bad_options_name_the_option(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_rollout_correction_args(**kwargs, prefix="x.")


def test_aggregate_loss_weights_each_token_before_the_reduction():
    g = torch.Generator().manual_seed(3)
    per_token = torch.randn(3, 4, generator=g, dtype=torch.float64)
    weights = torch.rand(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0]], dtype=torch.bool)
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"):
        got = aggregate_loss(per_token, mask, mode, token_weights=weights, loss_scale_factor=4.0)
        assert float(got) == pytest.approx(
            float(aggregate_loss(per_token * weights, mask, mode, loss_scale_factor=4.0))
        )
    # token-mean by hand: the weights change the numerator only
    by_hand = sum(float(per_token[i, t] * weights[i, t]) for i in range(3) for t in range(4) if mask[i, t]) / 6
    assert float(aggregate_loss(per_token, mask, token_weights=weights)) == pytest.approx(by_hand)


@pytest.mark.parametrize("name", ["ppo", "cispo", "gspo", "gspo_token", "gmpo"])
def test_every_built_in_loss_multiplies_its_token_terms_by_the_weights(name):
    """Loss and gradient with weights w equal those of the per-token terms recovered by probing one token at a time
    (token-sum: the loss is the sum of the per-token terms, so w_t scales exactly the t-th term)."""
    assert policy_loss_takes_token_weights(name)
    g = torch.Generator().manual_seed(4)
    old = -torch.rand(2, 3, generator=g, dtype=torch.float64) - 0.1
    logprobs = (old + 0.1 * torch.randn(2, 3, generator=g, dtype=torch.float64)).requires_grad_()
    adv = torch.tensor([[1.0, 1.0, 1.0], [-0.5, -0.5, -0.5]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    weights = torch.rand(2, 3, generator=g, dtype=torch.float64) * 2
    kwargs = dict(clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=3.0, loss_agg_mode="token-sum")
    kwargs.update(normalizer=None, loss_scale_factor=None, response_mask=mask)
    loss = POLICY_LOSSES[name](logprobs, old, adv, mask, token_weights=weights, **kwargs)[0]
    (grad,) = torch.autograd.grad(loss, logprobs)
    expected, expected_grad = 0.0, torch.zeros_like(old)
    for i, t in mask.nonzero().tolist():
        one_hot = torch.zeros_like(weights)
        one_hot[i, t] = 1.0
        term = POLICY_LOSSES[name](logprobs, old, adv, mask, token_weights=one_hot, **kwargs)[0]
        expected += float(weights[i, t]) * float(term.detach())
        expected_grad += weights[i, t] * torch.autograd.grad(term, logprobs)[0]
    assert float(loss.detach()) == pytest.approx(expected, rel=1e-12)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)
    unweighted = POLICY_LOSSES[name](logprobs, old, adv, mask, **kwargs)[0]
    ones = POLICY_LOSSES[name](logprobs, old, adv, mask, token_weights=torch.ones_like(weights), **kwargs)[0]
    assert float(ones.detach()) == pytest.approx(float(unweighted.detach()), rel=1e-12)


@pytest.mark.parametrize(("top_k", "top_p"), [(0, 0.5), (5, 1.0), (7, 0.3), (0, 0.999), (1, 0.5), (0, 1.0)])
def test_kept_log_mass_is_the_mass_hf_warpers_keep(top_k, top_p):
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    from lit_entropy.functional.rollout_correction import kept_log_mass

    g = torch.Generator().manual_seed(6)
    scores = torch.randn(40, 50, generator=g, dtype=torch.float64) * 2
    scores[:5, :10] = scores[:5, :1]  # ties at the top-k boundary are kept by both
    warped = scores.clone()
    if top_k:
        warped = TopKLogitsWarper(top_k)(None, warped)
    if top_p < 1:
        warped = TopPLogitsWarper(top_p)(None, warped)
    expected = torch.logsumexp(warped, -1) - torch.logsumexp(scores, -1)
    got = kept_log_mass(scores, top_k=top_k, top_p=top_p)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    assert (got <= 1e-12).all() and (got[0] < 0 if (top_k or top_p < 1) else got[0] == 0)

"""Our rollout correction against verl's ``rollout_corr_helper`` (the version ``.ci/verl-oracle.txt`` pins).

Skipped unless ``LIT_ENTROPY_VERL_DIR`` holds verl (``tests/_verl.py``; ``.ci/run`` installs it). Cases: float64
trainer / rollout log-probs with small gaps and a few large ones (weights far above and below the bounds), right-
padded and holed masks, an on-policy row (weight exactly 1), finite garbage at invalid positions.

Every level x mode, against what verl has:

- ``token`` / ``sequence`` x ``truncate``: ``compute_rollout_correction_weights(rollout_is=level, threshold=upper)``
  (TIS) gives our weights;
- ``token`` / ``sequence`` x ``mask``: the same with ``threshold="lower_upper"`` (IcePop: 0 outside the bounds, the
  token keeps its place in the denominator, as ours);
- ``geometric``: verl 0.9.1 has no geometric weight (``rollout_is`` is token or sequence). ``mask``: its rejection
  filter ``seq_mean_k1`` keeps the same sequences, given the bounds inverted (its k1 bounds are on
  ``pi_rollout / pi_trainer``, the inverse of the weight: ours [L, U] = verl's ``"1/U_1/L"``); ``truncate``: the
  raw weight is 1 / verl's per-sequence ``ppl_ratio`` (its own comment: "the inverse of geometric IS"), read from
  ``compute_offpolicy_metrics`` one row at a time, then ``min(w, U)``.

Metrics (``mismatch_metrics`` vs verl's): ``kl_k1`` = ``kl``, ``kl_k3`` = ``k3_kl``, the fractions above / below =
``rollout_is_ratio_fraction_high`` / ``_low``, the ESS = ``rollout_is_eff_sample_size`` (token level; at the
sequence level verl counts each sequence once per token, ours once: equal when every row has one length, compared
on such cases); ``ppl_ratio``: ours is rollout over trainer, verl's trainer over rollout (docs/differences.md), so
ours equals verl's with the two log-prob arguments swapped.
"""

from __future__ import annotations

import pytest
import torch
from _verl import load_verl

from lit_entropy.functional.rollout_correction import mismatch_metrics, mismatch_sums, rollout_correction

pytestmark = pytest.mark.verl
VERL = load_verl()
F64 = torch.float64
SEEDS = range(40)
CLOSE = {"rtol": 1e-9, "atol": 1e-12}
BOUNDS = ((2.0, None), (2.0, 0.8), (1.5, 0.2))  # (upper, lower): lower None = 1 / upper, verl's default too


def make_case(seed: int, *, ragged: bool = True) -> dict:
    g = torch.Generator().manual_seed(seed)
    n, t = int(torch.randint(1, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    rollout = -3 * torch.rand(n, t, generator=g, dtype=F64)
    gap = 0.1 * torch.randn(n, t, generator=g, dtype=F64)
    far = torch.rand(n, t, generator=g) < 0.15
    trainer = rollout + torch.where(far, 1.5 * torch.randn(n, t, generator=g, dtype=F64), gap)
    trainer[0] = rollout[0]  # on-policy row
    lengths = torch.randint(1, t + 1, (n,), generator=g) if ragged else torch.full((n,), t)
    mask = torch.arange(t) < lengths.unsqueeze(-1)
    if ragged and seed % 2:
        mask &= torch.rand(n, t, generator=g) > 0.25
        mask[:, 0] = True
    garbage = 3 * torch.randn(2, n, t, generator=g, dtype=F64)
    return {"trainer": torch.where(mask, trainer, garbage[0]), "rollout": torch.where(mask, rollout, garbage[1]),
            "mask": mask}  # fmt: skip


def verl_weights(case: dict, level: str, mode: str, upper: float, lower: float | None) -> tuple[torch.Tensor, dict]:
    threshold = upper if mode == "truncate" else f"{1.0 / upper if lower is None else lower}_{upper}"
    return VERL.rollout_corr.compute_rollout_correction_weights(
        case["trainer"] - case["rollout"], case["mask"].to(F64), rollout_is=level, rollout_is_threshold=threshold
    )


@pytest.mark.parametrize("mode", ["truncate", "mask"])
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_token_and_sequence_weights_equal_verls(level, mode):
    cases, cut = 0, 0
    for upper, lower in BOUNDS:
        for seed in SEEDS:
            case = make_case(seed)
            mask = case["mask"]
            ours = rollout_correction(
                case["trainer"], case["rollout"], mask, level=level, mode=mode, upper=upper, lower=lower
            )
            theirs, metrics = verl_weights(case, level, mode, upper, lower)
            where = f"{level} {mode} upper={upper} lower={lower} seed={seed}"
            torch.testing.assert_close(ours.weights, theirs * mask, **CLOSE, msg=lambda m, w=where: f"{w}: {m}")
            got = mismatch_metrics(mismatch_sums(case["trainer"], case["rollout"], mask, ours, level=level))
            assert got["frac_above"] == pytest.approx(metrics["rollout_is_ratio_fraction_high"], rel=1e-6), where
            if mode == "mask" or lower is None:  # verl's TIS has no lower bound: it counts below 1 / upper
                assert got["frac_below"] == pytest.approx(metrics["rollout_is_ratio_fraction_low"], rel=1e-6), where
            if level == "token" or mask.all():  # verl's ESS counts a sequence's weight once per token
                assert got["ess"] == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-6), where
            cases, cut = cases + 1, cut + bool((ours.above | ours.below).any())
    assert cases == len(BOUNDS) * len(SEEDS) and cut > 20  # the bounds bind in many cases


@pytest.mark.parametrize("level", ["token", "sequence"])
def test_sequence_ess_equals_verls_on_equal_lengths(level):
    """The ESS at either level where verl's token-weighted count and ours agree (every row one length)."""
    for seed in SEEDS:
        case = make_case(seed, ragged=False)
        ours = rollout_correction(case["trainer"], case["rollout"], case["mask"], level=level, upper=2.0)
        _, metrics = verl_weights(case, level, "truncate", 2.0, None)
        got = mismatch_metrics(mismatch_sums(case["trainer"], case["rollout"], case["mask"], ours, level=level))
        assert got["ess"] == pytest.approx(metrics["rollout_is_eff_sample_size"], rel=1e-6), f"{level} seed={seed}"


@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
def test_mask_mode_keeps_what_verls_k1_rejection_filter_keeps(level):
    """``mask`` mode keeps what verl's k1 rejection filter keeps (``token_k1``, ``seq_sum_k1``, ``seq_mean_k1``),
    its bounds being on the inverse ratio."""
    option = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}[level]
    for upper, lower in BOUNDS:
        low = 1.0 / upper if lower is None else lower
        for seed in SEEDS:
            case = make_case(seed)
            mask = case["mask"]
            ours = rollout_correction(
                case["trainer"], case["rollout"], mask, level=level, mode="mask", upper=upper, lower=lower
            )
            kept, _ = VERL.rollout_corr.compute_rollout_rejection_mask(
                case["trainer"] - case["rollout"],
                mask.to(F64),
                rollout_rs=option,
                rollout_rs_threshold=f"{1 / upper}_{1 / low}",
            )
            where = f"{level} upper={upper} lower={lower} seed={seed}"
            assert torch.equal(mask & ~(ours.above | ours.below), kept.bool()), where


def test_geometric_truncate_weights_equal_verls_inverse_ppl_ratio():
    """verl 0.9.1 has no geometric IS weight; its per-sequence ppl_ratio is the weight's inverse (one row at a time)."""
    for upper in (2.0, 1.2):
        for seed in SEEDS:
            case = make_case(seed)
            mask = case["mask"]
            ours = rollout_correction(case["trainer"], case["rollout"], mask, level="geometric", upper=upper)
            for i in range(mask.shape[0]):
                row = slice(i, i + 1)
                metrics = VERL.rollout_corr.compute_offpolicy_metrics(
                    case["trainer"][row], case["rollout"][row], mask[row].to(F64)
                )
                expected = min(1.0 / metrics["ppl_ratio"], upper)
                assert ours.weights[i][mask[i]].tolist() == pytest.approx([expected] * int(mask[i].sum()), rel=1e-7)


def test_mismatch_metrics_equal_verls():
    """k1 and k3 KL of the rollout from the trainer; the perplexity ratio with verl's two sides swapped."""
    for seed in SEEDS:
        case = make_case(seed)
        mask = case["mask"]
        got = mismatch_metrics(mismatch_sums(case["trainer"], case["rollout"], mask))
        theirs = VERL.rollout_corr.compute_offpolicy_metrics(case["trainer"], case["rollout"], mask.to(F64))
        swapped = VERL.rollout_corr.compute_offpolicy_metrics(case["rollout"], case["trainer"], mask.to(F64))
        assert got["kl_k1"] == pytest.approx(theirs["kl"], rel=1e-6, abs=1e-12), seed
        assert got["kl_k3"] == pytest.approx(theirs["k3_kl"], rel=1e-6, abs=1e-12), seed
        assert got["ppl_ratio"] == pytest.approx(swapped["ppl_ratio"], rel=1e-6), seed

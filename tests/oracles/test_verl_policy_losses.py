"""Our policy losses against verl's ``core_algos`` (the version ``.ci/verl-oracle.txt`` pins), on random cases.

Skipped unless ``LIT_ENTROPY_VERL_DIR`` holds verl (``tests/_verl.py``; ``.ci/run`` installs it). Each case is
float64 with right-padded or holed masks, rows without a valid token, an on-policy row (ratio exactly 1), tied
and zero advantages, tokens far outside the clip ranges, finite garbage at invalid positions, and, in half of the
cases, rollout-correction weights (verl's ``rollout_is_weights``, our ``token_weights``; some 0, some row-constant
as the sequence levels make them). Compared: the loss, its gradient w.r.t. the current log-probs, the clip
fractions.

Names: ``ppo`` = ``compute_policy_loss_vanilla`` (its ``clip_ratio_c`` cannot be turned off: our "no dual clip"
is compared with verl's at 1e12, where it never binds); ``gspo_token`` = ``compute_policy_loss_gspo`` (verl's
``gspo`` is the GSPO-token form), and ``gspo`` (one advantage per sequence) too; ``cispo`` =
``compute_policy_loss_cispo``; ``gmpo`` = ``compute_policy_loss_geo_mean``. The ``loss_agg_mode`` strings are
shared; verl reads ``loss_scale_factor`` from ``ActorConfig.global_batch_info``, where its workers put it. Clip
fractions: verl's ``pg_clipfrac`` is our ``clip_frac`` (both sides), its ``pg_clipfrac_lower`` our
``dual_clip_frac`` under ``ppo`` (0 under the others).

Differences documented in docs/differences.md, asserted as the relation they state, not as equality:

- approximate KL: ours is k3 (``r - 1 - log r``), verl's ``ppo_kl`` k1 (``-log r``): ours - verl's = mean(r - 1);
- ``gmpo``: verl averages over every row of the batch, rows without a valid token included, whatever the
  ``loss_agg_mode``; ours is ``seq-mean-token-mean`` over rows with a loss token: verl x N = ours x N_valid;
- ``gmpo`` clip fractions: verl counts a token wherever the log-space clamp changes its log-ratio; ours where the
  clip binds (the pessimistic side): verl's = ours + the tokens clamped on the side that does not bind;
- rollout weights under the losses with one term per sequence: ours multiply each token's copy of the sequence's
  term, so a sequence is weighed by the arithmetic mean of its tokens' weights, under every ``loss_agg_mode``;
  verl's ``gspo`` (GSPO-token) weighs each token's gradient by its own weight, its ``geo_mean`` a sequence by
  their geometric mean: ours(w) = verl(each row's arithmetic mean of w) for ``gspo`` and ``gmpo`` (equal when the
  weights are one per sequence, as the sequence and geometric levels make them; ``gspo_token`` equals verl's
  with the token weights themselves).
"""

from __future__ import annotations

import pytest
import torch
from _verl import load_verl

from lit_entropy.functional import LOSS_AGG_MODES, POLICY_LOSSES

pytestmark = pytest.mark.verl
VERL = load_verl()
F64 = torch.float64
SEEDS = range(30)
CLOSE = {"rtol": 1e-6, "atol": 1e-10}  # verl adds 1e-8 to its counts (masked_mean, seq-mean-token-mean)
# ... which moves a loss summed from terms of either sign (up to ~10) by up to ~1e-7 where it nearly cancels
LOSS_CLOSE = {"rtol": 1e-6, "atol": 1e-7}
NO_DUAL_CLIP = 1e12  # verl asserts clip_ratio_c > 1 and has no off switch; this one never binds

# (clip_ratio_low, clip_ratio_high, clip_ratio_c, spread of the log-ratio): PPO's symmetric clip, clip-higher with
# and without the dual clip, and GSPO's paper ranges with sequence ratios that move about as far as they do.
PPO_SETTINGS = ((0.2, 0.2, None, 0.3), (0.2, 0.28, 3.0, 0.3), (0.2, 0.28, None, 0.3), (0.1, 0.3, 3.0, 0.5))
GSPO_SETTINGS = ((3e-4, 4e-4, None, 1e-3), (0.2, 0.28, None, 0.3))
GMPO_SETTINGS = ((0.4, 0.4, None, 0.3), (0.2, 0.28, None, 0.5))
VERL_LOSS = {
    "ppo": "compute_policy_loss_vanilla",
    "gspo": "compute_policy_loss_gspo",
    "gspo_token": "compute_policy_loss_gspo",
    "cispo": "compute_policy_loss_cispo",
    "gmpo": "compute_policy_loss_geo_mean",
}


def make_case(seed: int, spread: float, *, token_advantages: bool) -> dict:
    """A random case: log-probs, advantages (``[N]`` per sequence and ``[N, T]``), mask, weights or None."""
    g = torch.Generator().manual_seed(seed)
    n, t = int(torch.randint(2, 9, (1,), generator=g)), int(torch.randint(1, 9, (1,), generator=g))
    old = -torch.rand(n, t, generator=g, dtype=F64) * 3 - 0.05
    logprobs = old + spread * torch.randn(n, t, generator=g, dtype=F64)
    if spread >= 0.1:  # a few tokens far outside every range, both ways (the dual clip binds above 3)
        far = torch.rand(n, t, generator=g) < 0.15
        logprobs = torch.where(far, old + 1.5 * torch.randn(n, t, generator=g, dtype=F64), logprobs)
    on_policy = int(torch.randint(0, n, (1,), generator=g))
    logprobs[on_policy] = old[on_policy]
    lengths = torch.randint(0, t + 1, (n,), generator=g)
    mask = torch.arange(t) < lengths.unsqueeze(-1)
    if seed % 2:  # holes, as a callback's keep mask or multi-turn observation tokens make them
        mask &= torch.rand(n, t, generator=g) > 0.25
    mask[int(torch.randint(0, n, (1,), generator=g)), 0] = True  # at least one valid token
    if seed % 3 == 0:  # discrete advantages: ties and zeros
        seq_adv = torch.randint(-1, 2, (n,), generator=g).to(F64)
    else:
        seq_adv = torch.randn(n, generator=g, dtype=F64)
    adv = seq_adv.unsqueeze(-1).expand(n, t).clone()
    if token_advantages:
        adv += 0.5 * torch.randn(n, t, generator=g, dtype=F64)
    weights = None
    if seed % 4 >= 2:
        weights = torch.exp(0.3 * torch.randn(n, t, generator=g, dtype=F64))
        if seed % 4 == 3:  # one weight per sequence (sequence / geometric levels)
            weights = weights[:, :1].expand(n, t).clone()
        weights[torch.rand(n, t, generator=g) < 0.1] = 0.0
    garbage = 3 * torch.randn(3, n, t, generator=g, dtype=F64)  # finite values that no side may read
    return {
        "logprobs": torch.where(mask, logprobs, garbage[0]),
        "old": torch.where(mask, old, garbage[1]),
        "adv": torch.where(mask, adv, garbage[2]),
        "seq_adv": seq_adv,
        "mask": mask,
        "weights": weights,
    }


def ours(name: str, case: dict, low: float, high: float, c: float | None, mode: str, scale: float | None):
    logprobs = case["logprobs"].clone().requires_grad_(True)
    adv = case["seq_adv"] if name == "gspo" else case["adv"]
    loss, stats = POLICY_LOSSES[name](
        logprobs,
        case["old"],
        adv,
        case["mask"],
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        loss_agg_mode=mode,
        normalizer=None,
        loss_scale_factor=scale,
        token_weights=case["weights"],
    )
    loss.backward()
    return loss.detach(), logprobs.grad, stats


def verl(name: str, case: dict, low: float, high: float, c: float | None, mode: str, scale: float | None, weights):
    config = VERL.ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=NO_DUAL_CLIP if c is None else c,
        global_batch_info={"loss_scale_factor": scale},
    )
    logprobs = case["logprobs"].clone().requires_grad_(True)
    mask = case["mask"]
    adv = case["seq_adv"].unsqueeze(-1).expand(mask.shape) if name == "gspo" else case["adv"]
    loss, metrics = getattr(VERL.core_algos, VERL_LOSS[name])(
        old_log_prob=case["old"],
        log_prob=logprobs,
        advantages=adv,
        response_mask=mask.to(F64),
        loss_agg_mode=mode,
        config=config,
        rollout_is_weights=weights,
    )
    loss.backward()
    return loss.detach(), logprobs.grad, metrics


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float(values[mask].mean())


def k3_minus_k1(case: dict) -> float:
    """mean(r - 1) over the valid tokens: our k3 approximate KL minus verl's k1 ``ppo_kl``."""
    log_ratio = (case["logprobs"] - case["old"]).clamp(-20, 20)
    return masked_mean(log_ratio.exp() - 1.0, case["mask"])


def verl_weights(name: str, case: dict) -> torch.Tensor | None:
    """The rollout weights verl gets: ours, or for the losses with one term per sequence each row's mean of ours."""
    if case["weights"] is None or name not in ("gspo", "gmpo"):
        return case["weights"]
    return row_mean_weights(case["weights"], case["mask"])


def settings(name: str) -> tuple:
    return {"ppo": PPO_SETTINGS, "gmpo": GMPO_SETTINGS}.get(name, GSPO_SETTINGS if "gspo" in name else PPO_SETTINGS)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", ["ppo", "gspo", "gspo_token", "cispo"])
def test_loss_gradient_and_clip_fractions_equal_verls(name, mode):
    """Every loss x loss_agg_mode verl shares: loss, gradient and clip fractions equal (approx KL: k3 vs k1)."""
    scales = (None, 3.0) if mode == "seq-mean-token-sum-norm" else (None,)
    cases, clipped, dual_clipped = 0, 0, 0
    for low, high, c, spread in settings(name):
        for scale in scales:
            for seed in SEEDS:
                case = make_case(seed, spread, token_advantages=name in ("ppo", "gspo_token", "cispo"))
                loss, grad, stats = ours(name, case, low, high, c, mode, scale)
                v_loss, v_grad, v = verl(name, case, low, high, c, mode, scale, verl_weights(name, case))
                where = f"{name} {mode} eps=({low}, {high}) c={c} scale={scale} seed={seed}"
                torch.testing.assert_close(loss, v_loss, **LOSS_CLOSE, msg=lambda m, w=where: f"loss, {w}: {m}")
                torch.testing.assert_close(grad, v_grad, **CLOSE, msg=lambda m, w=where: f"gradient, {w}: {m}")
                assert float(stats.clip_frac) == pytest.approx(v["actor/pg_clipfrac"], rel=1e-6, abs=1e-12), where
                dual = float(stats.dual_clip_frac) if name == "ppo" else 0.0
                assert dual == pytest.approx(v["actor/pg_clipfrac_lower"], rel=1e-6, abs=1e-12), where
                kl_gap = float(stats.approx_kl) - v["actor/ppo_kl"]
                assert kl_gap == pytest.approx(k3_minus_k1(case), rel=1e-6, abs=1e-10), where
                cases, clipped, dual_clipped = cases + 1, clipped + (stats.clip_frac > 0), dual_clipped + (dual > 0)
    assert cases >= 60 and clipped > 10  # the clip binds in many cases, and under ppo the dual clip in some
    assert dual_clipped > 5 or name != "ppo"


def row_mean_weights(weights: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's arithmetic mean of its valid tokens' weights, on every position (1 for a row without any)."""
    count = mask.sum(-1, keepdim=True)
    mean = torch.where(mask, weights, 0.0).sum(-1, keepdim=True) / count.clamp(min=1)
    return torch.where(count > 0, mean, 1.0).expand(mask.shape).clone()


def test_gmpo_equals_verls_geo_mean_up_to_its_documented_differences():
    """``gmpo`` vs verl's ``geo_mean`` under the papers' ``seq-mean-token-mean`` (verl has no other mode for it).

    Asserted: verl's loss and gradient x N = ours x N_valid (verl counts rows without a valid token); ours with
    token weights w = verl with each row's arithmetic mean of w; verl's clip fractions = ours + the tokens the
    log-space clamp changes on the side where the pessimistic min does not take it.
    """
    mode = "seq-mean-token-mean"
    cases = 0
    for low, high, c, spread in GMPO_SETTINGS:
        for seed in SEEDS:
            case = make_case(seed, spread, token_advantages=seed % 2 == 0)
            mask, adv = case["mask"], case["adv"]
            loss, grad, stats = ours("gmpo", case, low, high, c, mode, None)
            v_loss, v_grad, v = verl("gmpo", case, low, high, c, mode, None, verl_weights("gmpo", case))
            rows, valid_rows = mask.shape[0], int(mask.any(-1).sum())
            where = f"gmpo eps=({low}, {high}) seed={seed}"
            torch.testing.assert_close(
                loss * valid_rows / rows, v_loss, **LOSS_CLOSE, msg=lambda m, w=where: f"{w}: {m}"
            )
            torch.testing.assert_close(grad * valid_rows / rows, v_grad, **CLOSE, msg=lambda m, w=where: f"{w}: {m}")
            log_ratio = case["logprobs"] - case["old"]
            slack_high = masked_mean(((adv > 0) & (log_ratio < -low)).to(F64), mask)  # clamped up, min keeps log r
            slack_low = masked_mean(((adv < 0) & (log_ratio > high)).to(F64), mask)
            assert float(stats.clip_frac_high) + slack_high == pytest.approx(
                v["actor/pg_clipfrac"], rel=1e-6, abs=1e-9
            ), where
            assert float(stats.clip_frac_low) + slack_low == pytest.approx(
                v["actor/pg_clipfrac_lower"], rel=1e-6, abs=1e-9
            )
            assert float(stats.approx_kl) - v["actor/ppo_kl"] == pytest.approx(k3_minus_k1(case), rel=1e-6, abs=1e-9), (
                where
            )
            cases += 1
    assert cases == len(GMPO_SETTINGS) * len(SEEDS)


# ------------------------------------------------------------------- the peers' newest losses (issue 38.2)
PEER_LOSS = {
    "sapo": "compute_policy_loss_sapo",
    "dppo_tv": "compute_policy_loss_dppo_tv",
    "dppo_kl": "compute_policy_loss_dppo_kl",
}
# DPPO: clip_ratio_low / high are divergence thresholds (TV: probability differences; KL: nats), c the truncation
DPPO_SETTINGS = ((0.2, 0.2, None, 0.3), (0.05, 0.1, 3.0, 0.5), (0.01, 0.02, 20.0, 0.3))
SAPO_TAUS = ((1.0, 1.05), (0.5, 2.0))


def _peer(name: str, case: dict, low, high, c, mode, options: dict, *, verl_side: bool):
    logprobs = case["logprobs"].clone().requires_grad_(True)
    if verl_side:
        config = VERL.ActorConfig(
            strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=low, clip_ratio_low=low,
            clip_ratio_high=high, clip_ratio_c=NO_DUAL_CLIP if c is None else c,
            global_batch_info={"loss_scale_factor": None}, **options,
        )  # fmt: skip
        loss, metrics = getattr(VERL.core_algos, PEER_LOSS[name])(
            old_log_prob=case["old"], log_prob=logprobs, advantages=case["adv"],
            response_mask=case["mask"].to(F64), loss_agg_mode=mode, config=config, rollout_is_weights=case["weights"],
        )  # fmt: skip
    else:
        loss, metrics = POLICY_LOSSES[name](
            logprobs, case["old"], case["adv"], case["mask"], clip_ratio_low=low, clip_ratio_high=high,
            clip_ratio_c=c, loss_agg_mode=mode, normalizer=None, loss_scale_factor=None,
            token_weights=case["weights"], **options,
        )  # fmt: skip
    loss.backward()
    return loss.detach(), logprobs.grad, metrics


@pytest.mark.parametrize("name", ["dppo_tv", "dppo_kl"])
@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_dppo_equals_verls(name, mode):
    """DPPO-Binary TV / KL: loss, gradient, the trust-region fraction (verl's pg_clipfrac) and the truncated-IS
    fraction (verl's pg_clipfrac_lower, our dual_clip_frac) equal verl 0.9.1's."""
    cases = outside = truncated = 0
    for low, high, c, spread in DPPO_SETTINGS:
        for seed in SEEDS:
            case = make_case(seed, spread, token_advantages=True)
            loss, grad, stats = _peer(name, case, low, high, c, mode, {}, verl_side=False)
            v_loss, v_grad, v = _peer(name, case, low, high, c, mode, {}, verl_side=True)
            where = f"{name} {mode} delta=({low}, {high}) c={c} seed={seed}"
            torch.testing.assert_close(loss, v_loss, **LOSS_CLOSE, msg=lambda m, w=where: f"loss, {w}: {m}")
            torch.testing.assert_close(grad, v_grad, **CLOSE, msg=lambda m, w=where: f"gradient, {w}: {m}")
            assert float(stats.clip_frac) == pytest.approx(v["actor/pg_clipfrac"], rel=1e-6, abs=1e-12), where
            assert float(stats.dual_clip_frac) == pytest.approx(v["actor/pg_clipfrac_lower"], rel=1e-6, abs=1e-12)
            cases, outside, truncated = (
                cases + 1,
                outside + (stats.clip_frac > 0),
                truncated + (stats.dual_clip_frac > 0),
            )
    assert cases == len(DPPO_SETTINGS) * len(SEEDS) and outside > 10 and truncated > 3


def test_sapo_equals_verls():
    """SAPO under its paper's (and verl's only) aggregation, seq-mean-token-mean, with the paper's and other taus."""
    mode = "seq-mean-token-mean"
    for tau_pos, tau_neg in SAPO_TAUS:
        for spread in (0.3, 1.0):
            for seed in SEEDS:
                case = make_case(seed, spread, token_advantages=True)
                options = {"tau_pos": tau_pos, "tau_neg": tau_neg}
                loss, grad, stats = _peer("sapo", case, 0.2, 0.2, None, mode, options, verl_side=False)
                v_loss, v_grad, v = _peer("sapo", case, 0.2, 0.2, None, mode, options, verl_side=True)
                where = f"sapo taus=({tau_pos}, {tau_neg}) spread={spread} seed={seed}"
                torch.testing.assert_close(loss, v_loss, **LOSS_CLOSE, msg=lambda m, w=where: f"loss, {w}: {m}")
                torch.testing.assert_close(grad, v_grad, **CLOSE, msg=lambda m, w=where: f"gradient, {w}: {m}")
                assert float(stats.clip_frac) == v["actor/pg_clipfrac"] == 0.0

"""Entropy-control toolbox: Clip-Cov, KL-Cov, high-entropy selection, adaptive entropy bonus.

Pure functions against plain-Python references, global selection under 2 gloo ranks against one
process, and all providers composed in a short RFTModule fit on the tiny model.
"""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo

from lit_entropy.callbacks.dynamics_monitor import EntropyDynamicsMonitor
from lit_entropy.callbacks.entropy_control import AdaptiveEntropyBonus, ClipCov, HighEntropySelection, KLCov
from lit_entropy.functional.selection import (
    clip_cov_mask,
    covariance_scores,
    high_entropy_count,
    high_entropy_mask,
    kl_cov_coefficients,
    random_global_picks,
    selection_count,
)
from lit_entropy.protocol import LossCoefficientProvider, TokenMaskContext, TokenMaskProvider, TokenPenaltyProvider


def _context(seed: int = 0, rows: int = 8, cols: int = 10, ties: str | None = None) -> TokenMaskContext:
    """A rollout-like batch: per-sequence advantages (some 0), spread log-probs, ragged lengths.

    ``ties="integer"``: integer advantages, log-probs and half-integer entropies (mostly 0), so covariances
    and entropies tie heavily; ``ties="zero_adv"``: additionally every advantage is 0 (all groups
    all-correct or all-wrong), so every covariance is 0.
    """
    gen = torch.Generator().manual_seed(seed)
    adv = (torch.randint(-4, 5, (rows, 1), generator=gen).double() / 2).expand(rows, cols).contiguous()
    logp = -4 * torch.rand(rows, cols, generator=gen, dtype=torch.float64) ** 2
    entropy = 2 * torch.rand(rows, cols, generator=gen, dtype=torch.float64)
    if ties is not None:
        adv = torch.randint(-1, 2, (rows, 1), generator=gen).double().expand(rows, cols).contiguous()
        adv = torch.zeros_like(adv) if ties == "zero_adv" else adv
        logp = -torch.randint(0, 3, (rows, cols), generator=gen).double()
        entropy = torch.randint(0, 3, (rows, cols), generator=gen).double().clamp(min=1) / 2 - 0.5
    s = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.3
    avg = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.05
    lengths = torch.randint(3, cols + 1, (rows,), generator=gen)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    return TokenMaskContext(
        mask=mask, advantages=adv, discriminator=s, policy_average=avg, entropy=entropy, old_logprobs=logp
    )


def _rows(ctx: TokenMaskContext, index: slice) -> TokenMaskContext:
    return TokenMaskContext(
        **{
            name: getattr(ctx, name)[index]
            for name in ("mask", "advantages", "discriminator", "policy_average", "entropy", "old_logprobs")
        }
    )


def _valid(ctx: TokenMaskContext) -> list[tuple[int, int]]:
    rows, cols = ctx.mask.shape
    return [(i, j) for i in range(rows) for j in range(cols) if bool(ctx.mask[i, j])]


def _py_cov(ctx: TokenMaskContext) -> dict[tuple[int, int], float]:
    valid = _valid(ctx)
    a = {ij: float(ctx.advantages[ij]) for ij in valid}
    lp = {ij: float(ctx.old_logprobs[ij]) for ij in valid}
    ma, ml = sum(a.values()) / len(valid), sum(lp.values()) / len(valid)
    return {ij: (a[ij] - ma) * (lp[ij] - ml) for ij in valid}


def _py_top(scores: dict[tuple[int, int], float], k: int) -> set[tuple[int, int]]:
    """The k largest scores, ties broken by row-major position: sort by (-score, (row, col))."""
    return {ij for _, ij in sorted((-v, ij) for ij, v in scores.items())[:k]}


def _py_quantile(values: list[float], q: float) -> float:
    """Linear interpolation between order statistics (numpy / torch default)."""
    xs = sorted(values)
    pos = q * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def _masked_set(keep: torch.Tensor, mask: torch.Tensor) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in torch.nonzero(mask & ~keep).tolist()}


# ----------------------------------------------------------------------------------------- pure math
@pytest.mark.parametrize("seed", range(3))
def test_covariance_scores_match_python(seed):
    ctx = _context(seed)
    cov = covariance_scores(ctx.advantages, ctx.old_logprobs, ctx.mask)
    ref = _py_cov(ctx)
    for ij, value in ref.items():
        assert math.isclose(float(cov[ij]), value, rel_tol=1e-12, abs_tol=1e-12)
    assert bool(torch.isneginf(cov[~ctx.mask]).all())


def test_selection_count_is_verls_budget():
    for n in (0, 1, 7, 999, 5000, 123457):
        for ratio in (2e-4, 2e-3, 0.1, 1.0):
            assert selection_count(n, ratio) == max(int(ratio * n), 1)
    with pytest.raises(ValueError, match=r"ratio must be a number in \(0, 1\], got 0"):
        selection_count(10, 0)


@pytest.mark.parametrize("seed", range(4))
def test_clip_cov_mask_matches_python_reference(seed):
    ctx = _context(seed)
    ratio, lb, ub = 0.15, 0.5, 5.0
    keep = clip_cov_mask(
        ctx.advantages,
        ctx.old_logprobs,
        ctx.mask,
        ratio=ratio,
        lb=lb,
        ub=ub,
        generator=torch.Generator().manual_seed(seed),
    )
    cov = _py_cov(ctx)
    candidates = [ij for ij in _valid(ctx) if lb < cov[ij] < ub]  # row-major order
    k = max(int(ratio * len(cov)), 1)
    perm = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed)).tolist()
    expected = {candidates[i] for i in perm[:k]}
    assert _masked_set(keep, ctx.mask) == expected
    assert 0 < len(expected) < len(candidates), "the case must drop some but not all candidates"


def test_random_global_picks_union_of_shards_is_the_single_draw():
    total, k = 23, 9
    single = random_global_picks(total, k, 0, total, torch.Generator().manual_seed(5)).tolist()
    parts = []
    for offset, local in ((0, 7), (7, 10), (17, 6)):
        picks = random_global_picks(total, k, offset, local, torch.Generator().manual_seed(5))
        parts += [offset + int(p) for p in picks]
    assert sorted(parts) == single and len(single) == k
    with pytest.raises(ValueError, match="offset"):
        random_global_picks(5, 1, 4, 3, torch.Generator())


@pytest.mark.parametrize("ties", [None, "integer", "zero_adv"])
@pytest.mark.parametrize("seed", range(4))
def test_kl_cov_coefficients_pick_exactly_the_top_covariances(seed, ties):
    ctx = _context(seed, ties=ties)
    ratio, coef = 0.2, 0.7
    got = kl_cov_coefficients(ctx.advantages, ctx.old_logprobs, ctx.mask, ratio=ratio, coef=coef)
    cov = _py_cov(ctx)
    k = max(int(ratio * len(cov)), 1)
    chosen = {(int(i), int(j)) for i, j in torch.nonzero(got).tolist()}
    assert chosen == _py_top(cov, k) and len(chosen) == k
    assert all(v == pytest.approx(coef) for v in got[got != 0].tolist())
    if ties is not None:  # the k-th covariance is tied with others: a threshold rule would pick more
        kth = sorted(cov.values(), reverse=True)[k - 1]
        assert sum(v >= kth for v in cov.values()) > k


def test_kl_cov_all_zero_advantages_penalise_k_tokens_not_all():
    ctx = _context(0, ties="zero_adv")
    n = int(ctx.mask.sum())
    for ratio in (2e-3, 0.1):
        got = kl_cov_coefficients(ctx.advantages, ctx.old_logprobs, ctx.mask, ratio=ratio)
        # Every covariance is 0: the budget max(int(ratio * n), 1) goes to the first valid tokens, row-major.
        k = max(int(ratio * n), 1)
        assert n > 50 and [tuple(ij) for ij in torch.nonzero(got).tolist()] == _valid(ctx)[:k]


@pytest.mark.parametrize("seed", range(4))
def test_clip_cov_with_ties_drops_exactly_the_budget(seed):
    """Clip-Cov's uniform draw needs no tie rule: heavy ties, even all-zero covariances, drop exactly k."""
    for ties, lb in (("integer", 0.0), ("zero_adv", -1.0)):
        ctx = _context(seed, ties=ties)
        ratio, ub = 0.05, 5.0
        keep = clip_cov_mask(
            ctx.advantages,
            ctx.old_logprobs,
            ctx.mask,
            ratio=ratio,
            lb=lb,
            ub=ub,
            generator=torch.Generator().manual_seed(seed),
        )
        cov = _py_cov(ctx)
        candidates = [ij for ij in _valid(ctx) if lb < cov[ij] < ub]
        k = max(int(ratio * len(cov)), 1)
        perm = torch.randperm(len(candidates), generator=torch.Generator().manual_seed(seed)).tolist()
        assert _masked_set(keep, ctx.mask) == {candidates[i] for i in perm[:k]}
        assert len(candidates) > k


def _py_high_entropy_count(n: int, rho: float) -> int:
    """Exact arithmetic: TRL's ``>= (1 - rho)``-quantile keeps n - ceil((1 - rho)(n - 1)) distinct values."""
    return n - math.ceil((1 - Fraction(str(rho))) * (n - 1)) if n else 0


def test_high_entropy_count_is_trls_count_in_exact_arithmetic():
    for n in (0, 1, 2, 7, 10, 11, 101, 999):
        for rho in (0.2, 0.29, 0.3, 0.37, 0.5, 0.7, 1.0):
            assert high_entropy_count(n, rho) == _py_high_entropy_count(n, rho), (n, rho)


@pytest.mark.parametrize(("seed", "rho"), [(0, 0.2), (1, 0.5), (2, 0.37), (3, 1.0)])
def test_high_entropy_mask_keeps_the_top_quantile(seed, rho):
    ctx = _context(seed)
    keep = high_entropy_mask(ctx.entropy, ctx.mask, rho=rho)
    values = [float(ctx.entropy[ij]) for ij in _valid(ctx)]
    assert len(set(values)) == len(values)  # distinct: TRL's quantile rule and the exact top-k agree
    q = _py_quantile(values, 1 - rho)
    expected_kept = {ij for ij in _valid(ctx) if float(ctx.entropy[ij]) >= q}
    kept = {(int(i), int(j)) for i, j in torch.nonzero(keep).tolist()}
    assert kept == expected_kept
    assert kept == _py_top({ij: float(ctx.entropy[ij]) for ij in _valid(ctx)}, _py_high_entropy_count(len(values), rho))
    if rho == 1.0:
        assert kept == set(_valid(ctx))
    else:
        assert abs(len(kept) - rho * len(values)) <= 1


@pytest.mark.parametrize(("seed", "rho"), [(0, 0.2), (1, 0.5), (2, 0.37), (3, 0.05)])
def test_high_entropy_mask_with_ties_keeps_exactly_the_count(seed, rho):
    ctx = _context(seed, ties="integer")  # entropies in {0, 0.5}, mostly 0
    keep = high_entropy_mask(ctx.entropy, ctx.mask, rho=rho)
    entropy = {ij: float(ctx.entropy[ij]) for ij in _valid(ctx)}
    k = _py_high_entropy_count(len(entropy), rho)
    kept = {(int(i), int(j)) for i, j in torch.nonzero(keep).tolist()}
    assert kept == _py_top(entropy, k) and len(kept) == k
    q = _py_quantile(list(entropy.values()), 1 - rho)
    assert sum(v >= q for v in entropy.values()) > k  # the quantile rule would keep the tied tokens too


def test_protocol_roles():
    assert isinstance(ClipCov(), TokenMaskProvider) and not isinstance(ClipCov(), TokenPenaltyProvider)
    assert isinstance(KLCov(), TokenPenaltyProvider) and not isinstance(KLCov(), TokenMaskProvider)
    assert isinstance(HighEntropySelection(), TokenMaskProvider)
    bonus = AdaptiveEntropyBonus()
    assert isinstance(bonus, LossCoefficientProvider) and not isinstance(bonus, TokenMaskProvider)


def test_adaptive_entropy_bonus_follows_the_target_and_round_trips():
    cb = AdaptiveEntropyBonus(entropy_target=1.0, initial_coef=0.01, coef_delta=0.004, coef_min=0.0, coef_max=0.02)
    ctx = _context(0)
    mean_h = float(ctx.entropy[ctx.mask].mean())
    assert mean_h < 1.2  # the crafted batch: compare against targets on both sides
    expected = 0.01
    for target in (2.0, 2.0, 2.0, 0.1, 0.1):  # below target: up (clamped at 0.02); above: down
        cb.entropy_target = target
        coefficients = cb.loss_coefficients(None, None, ctx)
        expected = min(max(expected + (0.004 if mean_h < target else -0.004), 0.0), 0.02)
        assert coefficients == {"entropy_coef": pytest.approx(expected)}
    fresh = AdaptiveEntropyBonus(entropy_target=0.1, initial_coef=0.0)
    fresh.load_state_dict(cb.state_dict())
    assert fresh.coef == pytest.approx(expected) and fresh.num_batches == 5


# ------------------------------------------------------------------------------------- 2 gloo ranks
def _providers():
    return {
        "clip_cov": lambda: ClipCov(clip_cov_ratio=0.15, clip_cov_lb=0.5, clip_cov_ub=5.0, seed=3),
        "kl_cov": lambda: KLCov(kl_cov_ratio=0.1, ppo_kl_coef=0.5),
        "high_entropy": lambda: HighEntropySelection(rho=0.3),
    }


def _run_all(ctx: TokenMaskContext) -> dict[str, list]:
    out = {}
    for name, make in _providers().items():
        cb = make()
        result = cb.token_penalty(None, None, ctx) if name == "kl_cov" else cb.keep_mask(None, None, ctx)
        out[name] = result.tolist()
    adaptive = AdaptiveEntropyBonus(entropy_target=0.9, initial_coef=0.01, coef_delta=0.003)
    out["adaptive_coef"] = adaptive.loss_coefficients(None, None, ctx)["entropy_coef"]
    monitor = EntropyDynamicsMonitor()
    out["monitor"] = monitor.observe(ctx)
    return out


_DDP_CASES = [(0, None), (1, None), (2, None), (3, "integer"), (4, "zero_adv")]


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        results = {}
        for seed, ties in _DDP_CASES:
            full = _context(seed, rows=8, ties=ties)
            # Uneven shards (3 / 5 rows) so padding and offsets matter.
            local = _rows(full, slice(0, 3) if rank == 0 else slice(3, 8))
            results[f"{seed}-{ties}"] = _run_all(local)
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(results, fh)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_gloo_ranks_select_exactly_what_one_process_selects(tmp_path):
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    shards = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    differs_locally = False
    for seed, ties in _DDP_CASES:
        key = f"{seed}-{ties}"
        full = _context(seed, rows=8, ties=ties)
        single = _run_all(full)
        local_only = _run_all(_rows(full, slice(0, 3)))
        for name in _providers():
            joined = shards[0][key][name] + shards[1][key][name]
            assert joined == single[name], (key, name)
            differs_locally |= local_only[name] != shards[0][key][name]
        for rank in range(2):
            assert shards[rank][key]["adaptive_coef"] == pytest.approx(single["adaptive_coef"])
            for name, value in single["monitor"].items():
                assert shards[rank][key]["monitor"][name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
        if ties is not None:  # tokens tied at the cut sit on both ranks, and the cut leaves some out
            kl = torch.tensor(single["kl_cov"]) > 0
            cov = covariance_scores(full.advantages, full.old_logprobs, full.mask)
            tied = full.mask & (cov == cov[kl].min())
            assert bool(tied[:3].any() and tied[3:].any() and (tied & ~kl).any()), key
    assert differs_locally, "per-rank statistics would have selected other tokens somewhere"


# ------------------------------------------------------------------------- composed RFTModule fit
def test_providers_compose_by_and_under_a_real_trainer():
    from lightning.pytorch import Trainer, seed_everything

    from lit_entropy.assets import default_model_path
    from lit_entropy.data.datamodule import PromptDataModule
    from lit_entropy.module import RFTModule
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.settings import EvaluationConfig, LoggingConfig, OptimConfig, UpdateConfig

    class Recording(RFTModule):
        def apply_token_callbacks(self, experience):
            exp = super().apply_token_callbacks(experience)
            self.seen.append((exp.response_mask.clone(), exp.loss_mask.clone(), exp.penalty))
            return exp

    class RecHigh(HighEntropySelection):
        def keep_mask(self, trainer, pl_module, context):
            keep = super().keep_mask(trainer, pl_module, context)
            self.masks.append(keep.clone())
            return keep

    class RecClipCov(ClipCov):
        def keep_mask(self, trainer, pl_module, context):
            keep = super().keep_mask(trainer, pl_module, context)
            self.masks.append(keep.clone())
            return keep

    seed_everything(0)
    high, clip = RecHigh(rho=0.5), RecClipCov(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=100.0)
    high.masks, clip.masks = [], []
    kl = KLCov(kl_cov_ratio=0.5, ppo_kl_coef=1.0)  # exactly k tokens: enough to overlap the kept ones
    adaptive = AdaptiveEntropyBonus(entropy_target=50.0, initial_coef=0.0, coef_delta=0.01, coef_max=1.0)
    monitor = EntropyDynamicsMonitor(keep_history=True)
    # The shipped (warm-started) tiny model: it solves some prompts, so advantages are not all zero.
    module = Recording(
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        update=UpdateConfig(epochs=2),
        optim=OptimConfig(lr=1e-3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.seen = []
    data = PromptDataModule(
        tokenizer_name_or_path=default_model_path(), batch_size=4, num_train_examples=32, num_val_examples=4
    )
    trainer = Trainer(
        accelerator="cpu",
        max_steps=6,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        callbacks=[monitor, high, clip, kl, adaptive],
    )
    trainer.fit(module, data)
    batches = len(module.seen)
    assert batches == 3 and trainer.global_step == 6  # 2 epochs x 1 mini-batch per rollout batch
    only_high = only_clip = 0
    for (mask, loss_mask, penalty), keep_h, keep_c in zip(module.seen, high.masks, clip.masks, strict=True):
        assert torch.equal(loss_mask, mask & keep_h & keep_c)  # AND of the providers (observers keep all)
        only_high += int((mask & ~keep_h & keep_c).sum())
        only_clip += int((mask & keep_h & ~keep_c).sum())
        assert penalty is not None and bool((penalty[~mask] == 0).all()) and bool((penalty > 0).any())
    assert only_high > 0 and only_clip > 0, ("each provider must mask tokens the other keeps", only_high, only_clip)
    mask, _, penalty = module.seen[-1]
    n = float(mask.sum())
    logged = trainer.callback_metrics
    assert float(logged["train/high_entropy/frac"]) == pytest.approx(float((mask & ~high.masks[-1]).sum()) / n)
    assert float(logged["train/clip_cov/frac"]) == pytest.approx(float((mask & ~clip.masks[-1]).sum()) / n)
    assert float(logged["train/kl_cov/frac"]) == pytest.approx(float((penalty > 0).sum()) / n)
    assert float(logged["train/mask/loss_token_frac"]) == pytest.approx(float(module.seen[-1][1].sum()) / n)
    # Entropy far below the 50-nat target: the coefficient rose by delta per rollout batch.
    assert adaptive.coef == pytest.approx(0.03) and float(logged["train/loss/entropy_coef"]) == pytest.approx(0.03)
    assert "train/adaptive_entropy/coef" not in logged  # the module's train/loss/entropy_coef is that value
    assert float(logged["train/loss/token_penalty"]) > 0  # second epoch: the policy moved, |log p - log p_old| > 0
    # The monitor's batch entropy is the module's own train/entropy/mean, computed independently.
    expected = float(logged["train/entropy/mean"])
    assert monitor.history[-1]["train/dynamics/entropy"] == pytest.approx(expected, rel=1e-5)
    assert len(monitor.history) == 3 and "train/dynamics/agreement" in logged

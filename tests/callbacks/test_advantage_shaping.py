"""The issue-38 token callbacks (STARE, Entrocraft, S2T, advantage reweighting, unlikeliness reward, REPO-R).

Their math is checked against the authors' code in tests/functional/test_control.py; here: each callback returns
what its functional math returns on the global batch, its controller state evolves and survives a checkpoint,
2 gloo ranks produce exactly what one process produces, and under a real trainer the module trains on the
advantages and masks the callbacks return.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo

from lit_entropy.callbacks import (
    REPOR,
    STARE,
    AdvantageReweighting,
    Entrocraft,
    SpuriousTokenSilencing,
    UnlikelinessReward,
)
from lit_entropy.functional.control import (
    entrocraft_advantages,
    entrocraft_bounds,
    repo_r_advantages,
    reweighted_advantages,
    s2t_mask,
    stare_weights,
    unlikeliness_advantages,
)
from lit_entropy.protocol import TokenMaskContext, collect_token_advantages

F64 = torch.float64


def _context(seed: int, rows: int = 8, width: int = 6, entropy_scale: float = 1.0) -> TokenMaskContext:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.rand(rows, width, generator=gen) > 0.2
    mask[seed % rows] = False
    rewards = torch.randint(0, 2, (rows,), generator=gen).to(F64)
    adv = (rewards - 0.5).unsqueeze(-1).expand(rows, width) * torch.rand(rows, 1, generator=gen, dtype=F64)
    return TokenMaskContext(
        mask=mask,
        advantages=adv.masked_fill(~mask, 0.0).contiguous(),
        old_logprobs=-torch.rand(rows, width, generator=gen, dtype=F64) * 8,
        entropy=torch.rand(rows, width, generator=gen, dtype=F64) * entropy_scale,
        rewards=rewards,
    )


def _rows(ctx: TokenMaskContext, index: slice) -> TokenMaskContext:
    return ctx.rows(index).with_row_tensors({}, mask=ctx.mask[index])


def test_stare_is_its_math_on_the_global_batch_and_gates_on_the_entropy():
    ctx = _context(0, entropy_scale=0.5)  # mean entropy ~0.25 < 0.3: gate on
    cb = STARE(top_ratio=0.3, variant="C2")
    got = cb.token_advantages(None, None, ctx)
    weights = stare_weights(ctx.old_logprobs, ctx.advantages, ctx.mask, top_ratio=0.3, variant="C2")
    assert torch.equal(got, weights * ctx.advantages) and cb.gate_on
    assert bool((weights == 1.1).any() and (weights == 0.9).any())
    metrics = cb.last_metrics
    assert metrics["train/stare/gate_on"] == 1.0
    assert metrics["train/stare/entropy"] == pytest.approx(float(ctx.entropy[ctx.mask].mean()))
    assert metrics["train/stare/frac"] == pytest.approx(float((weights != 1)[ctx.mask].sum() / ctx.mask.sum()))
    hot = _context(0, entropy_scale=2.0)  # mean entropy ~1 > 0.3: GRPO
    assert torch.equal(cb.token_advantages(None, None, hot), hot.advantages) and not cb.gate_on
    assert cb.last_metrics["train/stare/frac"] == 0.0


def test_stare_micro_batch_scope_selects_within_each_chunk():
    ctx = _context(1, entropy_scale=0.5)
    cb = STARE(top_ratio=0.2, scope="micro_batch", micro_batch_rows=3)
    got = cb.token_advantages(None, None, ctx)
    chunks = [slice(0, 3), slice(3, 6), slice(6, 8)]
    weights = torch.cat(
        [stare_weights(ctx.old_logprobs[s], ctx.advantages[s], ctx.mask[s], top_ratio=0.2) for s in chunks]
    )
    assert torch.equal(got, weights * ctx.advantages)
    assert not torch.equal(weights, stare_weights(ctx.old_logprobs, ctx.advantages, ctx.mask, top_ratio=0.2))


def test_stare_adaptive_weights_move_and_are_checkpointed():
    cb = STARE(adaptive=True, alpha=0.1)
    for _ in range(3):
        cb.token_advantages(None, None, _context(2, entropy_scale=0.1))  # below target: W up, M down
    assert cb.reweight_w == pytest.approx(1.4) and cb.reweight_m == pytest.approx(0.6)
    fresh = STARE(adaptive=True, alpha=0.1)
    fresh.load_state_dict(cb.state_dict())
    assert (fresh.reweight_w, fresh.reweight_m, fresh.gate_on, fresh.num_batches) == (
        cb.reweight_w, cb.reweight_m, True, 3,
    )  # fmt: skip


def _mean_entropy(ctx: TokenMaskContext, target: float) -> TokenMaskContext:
    return ctx.with_row_tensors({"entropy": ctx.entropy * target / float(ctx.entropy[ctx.mask].mean())})


def test_entrocraft_follows_the_band_over_the_run():
    cb = Entrocraft(total_batches=4, signal="reward")
    ctx = _context(3)
    # bands at steps 1, 2, 3 of 4: (0.55, 0.65), (0.5, 0.6), (0.45, 0.55)
    for step, (entropy, phase) in enumerate(((0.7, "positive"), (0.55, "grpo"), (0.4, "negative")), start=1):
        batch = _mean_entropy(ctx, entropy)
        assert cb.last_metrics.get("train/entrocraft/phase") is None or step > 1
        with pytest.warns(UserWarning, match="no reward is negative") if phase == "negative" else _nothing():
            got = cb.token_advantages(None, None, batch)
        assert torch.equal(got, entrocraft_advantages(ctx.advantages, ctx.rewards, ctx.mask, phase))
        assert cb.last_metrics["train/entrocraft/phase"] == {"positive": 1.0, "grpo": 0.0, "negative": -1.0}[phase]
        assert cb.last_metrics["train/entrocraft/upper"] == pytest.approx(entrocraft_bounds(step, 4)[1])
    assert cb.num_batches == 3
    assert not bool((got != 0).any())  # 0/1 rewards below the band: nothing left (hence the warning)
    with pytest.raises(ValueError, match="set total_batches or trainer.max_steps"):
        Entrocraft().token_advantages(None, None, ctx)


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_s2t_callback_is_its_math_with_the_batch_quantile():
    ctx = _context(4)
    ctx = ctx.with_row_tensors({"old_logprobs": ctx.old_logprobs - 1.0})
    cb = SpuriousTokenSilencing(prob_threshold=0.01, entropy_quantile=0.8)
    keep = cb.keep_mask(None, None, ctx)
    assert torch.equal(keep, s2t_mask(ctx.old_logprobs, ctx.entropy, ctx.advantages, ctx.mask, prob_threshold=0.01))
    assert bool((ctx.mask & ~keep).any())
    threshold = torch.quantile(ctx.entropy[ctx.mask], 0.8)
    assert cb.last_metrics["train/s2t/entropy_threshold"] == pytest.approx(float(threshold), rel=1e-12)
    empty = ctx.with_row_tensors({}, mask=torch.zeros_like(ctx.mask))
    assert not bool(cb.keep_mask(None, None, empty).any())


def test_reweighting_unlikeliness_and_repo_r_are_their_math():
    ctx = _context(5)
    got = AdvantageReweighting().token_advantages(None, None, ctx)
    assert torch.equal(got, reweighted_advantages(ctx.advantages, ctx.old_logprobs, ctx.mask, alpha=0.2))
    unlikely = UnlikelinessReward(group_size=4)
    got = unlikely.token_advantages(None, None, ctx)
    want = unlikeliness_advantages(ctx.rewards, ctx.old_logprobs, ctx.mask, group_size=4, beta=0.25)
    assert torch.equal(got, want)
    with pytest.raises(TypeError, match="needs the group size"):
        UnlikelinessReward().token_advantages(None, object(), ctx)
    repo = REPOR(zeta=0.05)
    first = repo.token_advantages(None, None, ctx)
    assert torch.equal(first, repo_r_advantages(ctx.advantages, ctx.old_logprobs, ctx.entropy, ctx.mask, zeta=0.05))
    assert repo.initial_entropy == pytest.approx(float(ctx.entropy[ctx.mask].mean()))
    cooler = ctx.with_row_tensors({"entropy": ctx.entropy * 0.5})
    repo.token_advantages(None, None, cooler)
    assert repo.zeta == pytest.approx(0.1) and repo.last_metrics["train/repo_r/zeta"] == pytest.approx(0.1)
    fresh = REPOR()
    fresh.load_state_dict(repo.state_dict())
    assert (fresh.zeta, fresh.initial_entropy) == (repo.zeta, repo.initial_entropy)


class _Trainer:
    def __init__(self, callbacks):
        self.callbacks = callbacks


def test_advantage_providers_chain_in_callback_order():
    ctx = _context(6, entropy_scale=0.5)
    chain = [AdvantageReweighting(alpha=0.5), REPOR(zeta=0.2)]
    got = collect_token_advantages(_Trainer(chain), None, ctx)
    first = reweighted_advantages(ctx.advantages, ctx.old_logprobs, ctx.mask, alpha=0.5)
    want = repo_r_advantages(first, ctx.old_logprobs, ctx.entropy, ctx.mask, zeta=0.2)
    torch.testing.assert_close(got, want.float())
    assert got.dtype == torch.float32 and collect_token_advantages(_Trainer([]), None, ctx) is None


# ------------------------------------------------------------------------------------------ 2 gloo ranks
def _run_all(ctx: TokenMaskContext) -> dict[str, list]:
    return {
        "stare": STARE(top_ratio=0.3, variant="C2", target_entropy=10.0).token_advantages(None, None, ctx).tolist(),
        "s2t": SpuriousTokenSilencing(prob_threshold=0.05).keep_mask(None, None, ctx).tolist(),
        "entrocraft": Entrocraft(total_batches=10, lower_range=(0.45, 0.45), upper_range=(0.55, 0.55))
        .token_advantages(None, None, ctx)
        .tolist(),
        "repo_r": REPOR().token_advantages(None, None, ctx).tolist(),
    }


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        results = {}
        for seed in range(4):
            full = _context(seed, rows=8)
            results[str(seed)] = _run_all(_rows(full, slice(0, 3) if rank == 0 else slice(3, 8)))
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(results, fh)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_gloo_ranks_give_exactly_what_one_process_gives(tmp_path):
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    shards = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    differs_locally = False
    for seed in range(4):
        full = _context(seed, rows=8)
        single, local = _run_all(full), _run_all(_rows(full, slice(0, 3)))
        for name, value in single.items():
            assert shards[0][str(seed)][name] + shards[1][str(seed)][name] == value, (seed, name)
            differs_locally |= local[name] != shards[0][str(seed)][name]
    assert differs_locally, "per-rank statistics would have given other advantages or masks somewhere"


# ------------------------------------------------------------------------------------ a real RFTModule fit
def test_the_module_trains_on_the_callbacks_advantages_and_masks():
    from lightning.pytorch import Trainer, seed_everything

    from lit_entropy.assets import default_model_path
    from lit_entropy.data.datamodule import PromptDataModule
    from lit_entropy.module import RFTModule
    from lit_entropy.rollout import SamplingConfig
    from lit_entropy.settings import EvaluationConfig, LoggingConfig, OptimConfig

    class Recording(RFTModule):
        def apply_token_callbacks(self, experience):
            before = experience.advantages.clone()
            exp = super().apply_token_callbacks(experience)
            self.seen.append((before, exp.advantages.clone(), exp.response_mask.clone(), exp.loss_mask.clone()))
            return exp

    class RecSTARE(STARE):
        def token_advantages(self, trainer, pl_module, context):
            out = super().token_advantages(trainer, pl_module, context)
            self.outputs.append(out.clone())
            return out

    seed_everything(0)
    stare = RecSTARE(top_ratio=0.5, target_entropy=100.0, reweight_w=2.0)
    stare.outputs = []
    unlikely = UnlikelinessReward(beta=0.5)
    s2t = SpuriousTokenSilencing(prob_threshold=0.5, entropy_quantile=1.0)
    module = Recording(
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        optim=OptimConfig(lr=1e-3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.seen = []
    data = PromptDataModule(
        tokenizer_name_or_path=default_model_path(), batch_size=4, num_train_examples=32, num_val_examples=4
    )
    trainer = Trainer(
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, callbacks=[unlikely, stare, s2t],
    )  # fmt: skip
    trainer.fit(module, data)
    assert len(module.seen) == 3 == len(stare.outputs)
    changed = masked = 0
    for (before, after, mask, loss_mask), out in zip(module.seen, stare.outputs, strict=True):
        assert torch.equal(after, out.float())  # the chain's last output is what the loss reads
        changed += int((after != before)[mask].sum())
        masked += int((mask & ~loss_mask).sum())
    assert changed > 0 and masked > 0
    logged = trainer.callback_metrics
    for tag in ("train/stare/frac", "train/unlikeliness/scaled_frac", "train/s2t/frac"):
        assert tag in logged and math.isfinite(float(logged[tag])), tag

"""EntropyDiscriminatorClipping: protocol checks, exact global masks under 2 gloo ranks, a minimal module."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo
from _free_logit_policy import FreeLogitPolicy
from lightning.pytorch import LightningModule, Trainer

from lit_entropy.callbacks import EntropyDiscriminatorClipping
from lit_entropy.protocol import TokenMaskContext


def _reference_masked(
    context: TokenMaskContext, method: str, mu: float, max_frac: float | None
) -> set[tuple[int, int]]:
    """Plain-Python THEORY §3: the (row, col) of the tokens a 1-process run masks (one-sided)."""
    rows, cols = context.mask.shape
    valid = [(i, j) for i in range(rows) for j in range(cols) if bool(context.mask[i, j])]
    s = {ij: float(context.discriminator[ij]) for ij in valid}
    adv = {ij: float(context.advantages[ij]) for ij in valid}
    if method == "clip_b":
        mean = sum(s.values()) / len(valid)
        std = math.sqrt(sum((v - mean) ** 2 for v in s.values()) / len(valid))
        if std == 0:
            return set()
        return {ij for ij in valid if adv[ij] < 0 and s[ij] - mean < -mu * std}
    d = {ij: float(context.policy_average[ij]) - s[ij] for ij in valid}
    mean = sum(d.values()) / len(valid)
    std = math.sqrt(sum((v - mean) ** 2 for v in d.values()) / len(valid))
    candidates = [ij for ij in valid if adv[ij] < 0 and d[ij] > mu * std]
    if max_frac is None:
        return set(candidates)
    cap = max(math.floor(max_frac * len(valid)), 1)
    # The cap largest D, ties broken by row-major position.
    return {ij for _, ij in sorted((-d[ij], ij) for ij in candidates)[:cap]}


def _global_batch(seed: int = 0, rows: int = 8, cols: int = 12, ties: bool = False) -> TokenMaskContext:
    """Heavy-tailed S so both methods and the cap have something to mask; ``ties``: integer S, E_p[S] = 0."""
    gen = torch.Generator().manual_seed(seed)
    discriminator = torch.randn(rows, cols, generator=gen, dtype=torch.float64) ** 3
    policy_average = 0.1 * torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    advantages = torch.randn(rows, 1, generator=gen, dtype=torch.float64).expand(rows, cols).contiguous()
    if ties:  # two rows in three penalised (A < 0), so the cap binds
        discriminator, policy_average = discriminator.round().clamp(-2, 2), torch.zeros_like(policy_average)
        advantages = torch.where(torch.arange(rows).unsqueeze(1) % 3 == 2, 1.0, -1.0).double().expand(rows, cols)
    lengths = torch.randint(3, cols + 1, (rows,), generator=gen)
    mask = torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1)
    return TokenMaskContext(
        mask=mask, advantages=advantages, discriminator=discriminator, policy_average=policy_average
    )


def _rows(context: TokenMaskContext, index: slice) -> TokenMaskContext:
    return TokenMaskContext(
        mask=context.mask[index],
        advantages=context.advantages[index],
        discriminator=context.discriminator[index],
        policy_average=context.policy_average[index],
    )


CASES = [("clip_b", 1.0, None), ("clip_v", 1.5, None), ("clip_v", 1.0, 0.02)]
# Integer D with many candidates tied at the cap (checked in test_cases_mask_something).
TIE_CASE = ("clip_v", 0.3, 0.05)


def test_clip_v_cap_with_ties_masks_exactly_the_cap():
    for seed in range(5):
        context = _global_batch(seed, ties=True)
        keep = EntropyDiscriminatorClipping(*TIE_CASE[:1], mu=TIE_CASE[1], max_frac=TIE_CASE[2]).keep_mask(
            None, None, context
        )
        masked = {(int(i), int(j)) for i, j in torch.nonzero(context.mask & ~keep).tolist()}
        assert masked == _reference_masked(context, *TIE_CASE)
        assert len(masked) == max(math.floor(TIE_CASE[2] * int(context.mask.sum())), 1)  # the cap binds


@pytest.mark.parametrize(("method", "mu", "max_frac"), CASES)
@pytest.mark.parametrize("seed", range(5))
def test_single_process_masks_match_reference(method, mu, max_frac, seed):
    context = _global_batch(seed)
    keep = EntropyDiscriminatorClipping(method, mu=mu, max_frac=max_frac).keep_mask(None, None, context)
    masked = {(i, j) for i, j in zip(*torch.nonzero(context.mask & ~keep, as_tuple=True), strict=True)}
    masked = {(int(i), int(j)) for i, j in masked}
    assert masked == _reference_masked(context, method, mu, max_frac)
    assert not bool((keep & ~context.mask).any()), "keep mask must be a subset of the response mask"


def test_cases_mask_something():
    """Guard against a vacuous test: the crafted batches do trigger masking and the cap."""
    context = _global_batch(0)
    for method, mu, max_frac in CASES:
        masked = _reference_masked(context, method, mu, max_frac)
        assert masked, (method, mu, max_frac)
    uncapped = _reference_masked(context, "clip_v", 1.0, None)
    capped = _reference_masked(context, "clip_v", 1.0, 0.02)
    assert len(capped) < len(uncapped)
    # The tie batches: candidates tied at the cap on both halves, more of them than the cap leaves room for.
    for seed in range(3):
        context = _global_batch(seed, ties=True)
        capped = _reference_masked(context, *TIE_CASE)
        uncapped = _reference_masked(context, TIE_CASE[0], TIE_CASE[1], None)
        d = {ij: -float(context.discriminator[ij]) for ij in uncapped}
        tied = {ij for ij in uncapped if d[ij] == min(d[c] for c in capped)}
        assert tied - capped and {i for i, _ in tied} & {0, 1, 2, 3} and {i for i, _ in tied} & {4, 5, 6, 7}, seed


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        results = {}
        for seed in range(3):
            for ties, cases in ((False, CASES), (True, [TIE_CASE])):
                full = _global_batch(seed, ties=ties)
                half = full.mask.shape[0] // world_size
                local = _rows(full, slice(rank * half, (rank + 1) * half))
                for method, mu, max_frac in cases:
                    cb = EntropyDiscriminatorClipping(method, mu=mu, max_frac=max_frac)
                    results[f"{seed}-{ties}-{method}-{mu}-{max_frac}"] = cb.keep_mask(None, None, local).tolist()
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(results, fh)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_two_gloo_ranks_mask_exactly_what_one_process_masks(tmp_path):
    """Each rank holds half of the global batch; the union of their masks equals the 1-process mask."""
    world_size = 2
    mp.spawn(_ddp_worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size, join=True)
    shards = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(world_size)]
    for seed in range(3):
        for ties, cases in ((False, CASES), (True, [TIE_CASE])):
            full = _global_batch(seed, ties=ties)
            for method, mu, max_frac in cases:
                key = f"{seed}-{ties}-{method}-{mu}-{max_frac}"
                distributed = torch.tensor(shards[0][key] + shards[1][key])
                single = EntropyDiscriminatorClipping(method, mu=mu, max_frac=max_frac).keep_mask(None, None, full)
                assert torch.equal(distributed, single), key
            # ... and the global statistics matter: per-shard statistics would give another answer somewhere.
    local_only = [
        EntropyDiscriminatorClipping("clip_b", mu=1.0).keep_mask(None, None, _rows(_global_batch(s), slice(0, 4)))
        for s in range(3)
    ]
    global_masks = [torch.tensor(shards[0][f"{s}-False-clip_b-1.0-None"]) for s in range(3)]
    assert any(not torch.equal(a, b) for a, b in zip(local_only, global_masks, strict=True))


def test_default_mu_per_method():
    assert EntropyDiscriminatorClipping("clip_b").mu == 2.5
    assert EntropyDiscriminatorClipping("clip_v").mu == 8.5


class _NoProtocol(LightningModule):
    pass


class _NoPolicyAverage(LightningModule):
    def token_mask_fields(self):
        return frozenset({"mask", "advantages", "discriminator"})


def test_setup_names_what_the_module_lacks():
    with pytest.raises(TypeError, match=r"_NoProtocol has no token_mask_fields"):
        EntropyDiscriminatorClipping("clip_b").setup(None, _NoProtocol(), "fit")
    EntropyDiscriminatorClipping("clip_b").setup(None, _NoPolicyAverage(), "fit")  # clip_b needs no averages
    with pytest.raises(TypeError, match=r"policy_average"):
        EntropyDiscriminatorClipping("clip_v").setup(None, _NoPolicyAverage(), "fit")


def test_state_dict_round_trip():
    cb = EntropyDiscriminatorClipping("clip_b", mu=1.0)
    cb.keep_mask(None, None, _global_batch(0))
    state = cb.state_dict()
    assert state["num_batches"] == 1 and state["num_acted_on"] > 0
    fresh = EntropyDiscriminatorClipping("clip_b", mu=1.0)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    assert "clip_b" in cb.state_key


@pytest.mark.parametrize("method", ["clip_b", "clip_v"])
def test_callback_inside_a_minimal_lightning_module(method):
    torch.manual_seed(0)
    module = FreeLogitPolicy(positions=6, vocab=16, rows=32, lr=0.5, scale=2.0, dtype=torch.float32, batches=4)
    callback = EntropyDiscriminatorClipping(method, mu=1.0, max_frac=0.05 if method == "clip_v" else None)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=4,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    assert callback.num_batches == 4
    assert len(module.kept) == 4
    assert 0 < callback.num_acted_on < callback.num_tokens
    assert min(module.kept) < 1.0
    logged = trainer.callback_metrics
    for name in ("train/entropy_clip/frac", "train/entropy_clip/frac_neg", "train/entropy_clip/s_mean"):
        assert name in logged
    assert "train/entropy_clip/frac_pos" not in logged  # one-sided: A > 0 tokens are never masked
    assert "train/entropy_clip/nonfinite_frac" not in logged  # every S was finite
    if method == "clip_v":
        assert "train/entropy_clip/centred_s_mean" in logged
        assert callback.num_acted_on <= 4 * max(math.floor(0.05 * 32 * 6), 1)

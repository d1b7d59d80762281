"""TokenCallback, the one base of the token callbacks: all-reduced counters, checkpoints, tags, logging, hooks.

Counters are checked over 2 gloo ranks against sums formed by hand from each rank's known share; counts of
acted-on tokens against the callbacks' own definitions re-derived in plain Python.
"""

from __future__ import annotations

import inspect
import json
import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo
from _token_callbacks import CORE, random_context
from lightning.pytorch import Callback

from lit_entropy.callbacks import (
    AdaptiveEntropyBonus,
    ClipCov,
    EntropyDiscriminatorClipping,
    EntropyDynamicsMonitor,
    HighEntropySelection,
    KLCov,
    RandomNegativeMasking,
    TokenCallback,
)
from lit_entropy.callbacks.base import LEGACY_STATE_KEYS, check_log_prefix, module_is_attached
from lit_entropy.protocol import TokenMaskContext

ALL = CORE


def _context(seed: int = 0, rows: int = 8, cols: int = 6) -> TokenMaskContext:
    return random_context(seed, rows, cols)


def _run(callback: TokenCallback, context: TokenMaskContext, pl_module=None) -> torch.Tensor | None:
    """One rollout batch through whichever protocol method the callback implements; returns what it acted on."""
    if isinstance(callback, EntropyDynamicsMonitor):
        callback.observe_keep_mask(None, pl_module, context, context.mask)
        return None
    if isinstance(callback, KLCov):
        return callback.token_penalty(None, pl_module, context) > 0
    if isinstance(callback, AdaptiveEntropyBonus):
        callback.loss_coefficients(None, pl_module, context)
        return None
    return context.mask & ~callback.keep_mask(None, pl_module, context)


def _make(cls):
    if cls is EntropyDiscriminatorClipping:
        return cls("clip_b", mu=1.0)
    if cls is RandomNegativeMasking:
        return cls(mu=1.0, seed=5)
    if cls is ClipCov:
        return cls(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=10.0, seed=2)
    if cls is KLCov:
        return cls(kl_cov_ratio=0.2)
    if cls is HighEntropySelection:
        return cls(rho=0.3)
    return cls()


# ------------------------------------------------------------------------------------- counters, 1 rank
class _Counting(TokenCallback):
    required_fields = frozenset({"mask"})


def test_counts_sum_per_name_and_close_the_batch():
    cb = _Counting("train/counting")
    mask = torch.tensor([[True, True, False], [True, False, False]])
    acted = torch.tensor([[True, False, True], [False, False, True]])  # the acted-on outside the mask do not count
    cb.count_tokens(mask, acted)
    cb.count("x", 2.5)
    cb.count("x", torch.tensor(0.25))
    assert cb.reduce_counts() == {"tokens": 3.0, "acted_on": 1.0, "x": 2.75}
    assert (cb.num_batches, cb.num_tokens, cb.num_acted_on) == (1, 3, 1)
    assert cb.reduce_counts() == {}  # the tallies are cleared with the batch
    assert (cb.num_batches, cb.num_tokens, cb.num_acted_on) == (2, 3, 1)


@pytest.mark.parametrize("cls", ALL)
def test_acted_on_counts_what_the_callback_did(cls):
    cb, total, acted_total = _make(cls), 0, 0
    for seed in range(3):
        ctx = _context(seed)
        acted = _run(cb, ctx)
        total += sum(bool(v) for v in ctx.mask.flatten())
        acted_total += 0 if acted is None else sum(bool(v) for v in (acted & ctx.mask).flatten())
    assert (cb.num_batches, cb.num_tokens, cb.num_acted_on) == (3, total, acted_total)
    if cls not in (EntropyDynamicsMonitor, AdaptiveEntropyBonus):
        assert acted_total > 0  # the cases act on something, so the count is tested


# ------------------------------------------------------------------------------------ counters, 2 ranks
def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        cb = _Counting("train/counting")
        # Each rank counts its own numbers, in a different order: the sum is taken per name.
        names = ["b", "a"] if rank else ["a", "b"]
        for name in names:
            cb.count(name, (rank + 1) * (10.0 if name == "a" else 0.5))
        cb.count_tokens(torch.ones(rank + 2, 3, dtype=torch.bool), torch.eye(rank + 2, 3, dtype=torch.bool))
        counts = cb.reduce_counts()
        full = _context(7, rows=8)
        local = TokenMaskContext(**{f: getattr(full, f)[:3] if rank == 0 else getattr(full, f)[3:] for f in _FIELDS})
        high = HighEntropySelection(rho=0.3)
        clip = EntropyDiscriminatorClipping("clip_b", mu=1.0)
        for cb2 in (high, clip):
            cb2.keep_mask(None, None, local)
        result = {
            "counts": counts,
            "totals": [cb.num_batches, cb.num_tokens, cb.num_acted_on],
            "high": high.state_dict(),
            "clip": clip.state_dict(),
            "clip_metrics": clip.last_metrics,
        }
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(result, fh)
    finally:
        dist.destroy_process_group()


_FIELDS = ("mask", "advantages", "discriminator", "policy_average", "entropy", "old_logprobs")


@pytest.mark.ddp
def test_counters_are_summed_over_two_gloo_ranks(tmp_path):
    mp.spawn(_ddp_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    shards = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # Hand sums: rank r counts a = 10 (r + 1), b = 0.5 (r + 1), (r + 2) x 3 tokens of which r + 2 on the diagonal.
    expected = {"a": 10.0 + 20.0, "b": 0.5 + 1.0, "tokens": 6.0 + 9.0, "acted_on": 2.0 + 3.0}
    full = _context(7, rows=8)
    n = int(full.mask.sum())
    kept = 1 + math.floor(0.3 * (n - 1))  # the high-entropy count, re-derived
    single = EntropyDiscriminatorClipping("clip_b", mu=1.0)
    single.keep_mask(None, None, full)
    for shard in shards:  # every rank holds the global numbers
        assert shard["counts"] == expected
        assert shard["totals"] == [1, 15, 5]
        assert shard["high"] == {"num_batches": 1, "num_tokens": n, "num_acted_on": n - kept}
        assert shard["clip"] == single.state_dict()
        assert shard["clip_metrics"] == pytest.approx(single.last_metrics, rel=1e-12)
    assert single.num_acted_on > 0


# ------------------------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("cls", ALL)
def test_state_dict_round_trip_continues_identically(cls):
    first = _make(cls)
    _run(first, _context(0))
    state = first.state_dict()
    assert {"num_batches", "num_tokens", "num_acted_on"} <= set(state)
    resumed = _make(cls)
    if cls is AdaptiveEntropyBonus:
        resumed = AdaptiveEntropyBonus(initial_coef=0.04)  # the checkpoint's coefficient wins
    resumed.load_state_dict(state)
    assert _comparable(resumed.state_dict()) == _comparable(state)
    a, b = _run(first, _context(1)), _run(resumed, _context(1))  # the next batch acts identically
    assert (a is None and b is None) or torch.equal(a, b)
    assert _comparable(resumed.state_dict()) == _comparable(first.state_dict())


def _comparable(state: dict) -> dict:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in state.items()}


@pytest.mark.parametrize(
    ("cls", "old"),
    [
        (EntropyDiscriminatorClipping, {"num_batches": 3, "num_tokens": 120, "num_masked": 7}),
        (ClipCov, {"num_batches": 3, "num_tokens": 120, "num_selected": 7}),
        (KLCov, {"num_batches": 3, "num_tokens": 120, "num_selected": 7}),
        (HighEntropySelection, {"num_batches": 3, "num_tokens": 120, "num_selected": 7}),
        (AdaptiveEntropyBonus, {"num_batches": 3, "num_tokens": 120, "num_selected": 0, "coef": 0.02}),
        # RandomNegativeMasking kept no batch count, the monitor no token counts: they start at 0.
        (RandomNegativeMasking, {"num_tokens": 120, "num_masked": 7}),
        (
            EntropyDynamicsMonitor,
            {"num_batches": 3, "num_compared": 2, "num_agree": 1, "prev_entropy": 0.5, "prev_predicted": -0.1},
        ),
    ],
)
def test_older_checkpoint_keys_load(cls, old):
    cb = _make(cls)
    cb.load_state_dict(dict(old))
    acted = old.get("num_masked", old.get("num_selected", 0))
    assert (cb.num_batches, cb.num_tokens, cb.num_acted_on) == (
        old.get("num_batches", 0),
        old.get("num_tokens", 0),
        acted,
    )
    state = cb.state_dict()
    assert not set(LEGACY_STATE_KEYS) & set(state)  # saved again under today's name
    assert state["num_acted_on"] == acted


def test_clip_cov_resumes_its_draw_sequence_from_the_old_batch_count():
    """ClipCov's draw depends on the batch count: an old checkpoint resumes the same sequence."""
    uninterrupted = _make(ClipCov)
    for seed in range(2):
        _run(uninterrupted, _context(seed))
    resumed = _make(ClipCov)
    resumed.load_state_dict({"num_batches": 2, "num_tokens": 0, "num_selected": 0})
    assert resumed.num_batches == uninterrupted.num_batches == 2
    assert torch.equal(_run(uninterrupted, _context(5)), _run(resumed, _context(5)))


# ---------------------------------------------------------------------------------------------- tags
_TAGS = {
    EntropyDiscriminatorClipping: {"frac", "frac_neg", "s_mean", "centred_s_mean"},  # the context has E_p[S]
    RandomNegativeMasking: {"frac"},
    ClipCov: {"frac", "candidate_frac"},
    KLCov: {"frac"},
    HighEntropySelection: {"frac", "threshold"},
    AdaptiveEntropyBonus: set(),  # the module logs its coefficient and the entropy it reacts to
    EntropyDynamicsMonitor: {"predicted", "entropy", "s_mean", "centred_s_mean"}
    | {f"predicted_{q}" for q in ("a_pos_d_pos", "a_pos_d_neg", "a_neg_d_pos", "a_neg_d_neg")},
}


class _Recorder:
    """A module attached to a trainer, as far as the logging guard can tell; records what it is asked to log."""

    def __init__(self, attached: bool) -> None:
        self.trainer = object() if attached else None
        self.logged: dict[str, float] = {}

    def log(self, name, value, **kwargs):
        assert kwargs == {"on_step": True, "on_epoch": False, "batch_size": 1}
        self.logged[name] = value


@pytest.mark.parametrize("cls", ALL)
def test_every_tag_is_prefix_slash_name(cls):
    default = _make(cls)
    module = _Recorder(attached=True)
    _run(default, _context(0), module)
    expected = {f"{default.log_prefix}/{name}" for name in _TAGS[cls]}
    assert set(module.logged) == expected == set(default.last_metrics)
    assert all(tag == default.tag(tag.rsplit("/", 1)[1]) for tag in expected)
    custom = type(default)(**{**_init_args(default), "log_prefix": "train/mine"})
    _run(custom, _context(0), _Recorder(attached=True))
    assert set(custom.last_metrics) == {f"train/mine/{name}" for name in _TAGS[cls]}


def _init_args(cb) -> dict:
    names = [n for n in inspect.signature(type(cb)).parameters if hasattr(cb, n)]
    return {n: getattr(cb, n) for n in names}


def test_random_mask_frac_is_under_its_prefix():
    cb = RandomNegativeMasking(mu=1.0)
    _run(cb, _context(0))
    assert set(cb.last_metrics) == {"train/random_mask/frac"}
    assert cb.last_metrics["train/random_mask/frac"] == pytest.approx(cb.num_acted_on / cb.num_tokens)


def test_logging_guard_logs_only_when_attached():
    cb = _make(HighEntropySelection)
    detached = _Recorder(attached=False)
    _run(cb, _context(0), detached)
    assert detached.logged == {} and set(cb.last_metrics) == {"train/high_entropy/frac", "train/high_entropy/threshold"}
    assert not module_is_attached(None) and not module_is_attached(detached) and module_is_attached(_Recorder(True))


@pytest.mark.parametrize("prefix", ["train/x", "x", "a/b/c"])
def test_valid_prefixes(prefix):
    assert check_log_prefix(prefix) == prefix


# --------------------------------------------------------------------------------------- Lightning hooks
@pytest.mark.parametrize("cls", (TokenCallback, *ALL))
def test_lightning_hooks_carry_override(cls):
    hooks = {name for name in dir(Callback) if not name.startswith("__")}
    for klass in cls.__mro__:
        if not issubclass(klass, TokenCallback):
            continue
        for name, member in vars(klass).items():
            if name in hooks:
                fn = member.fget if isinstance(member, property) else member
                assert getattr(fn, "__override__", False), f"{klass.__name__}.{name} lacks @override"

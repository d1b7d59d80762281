"""TokenEntropy, ClipRatio, AvgAtK and PassAtK against plain-Python references, streaming, state and DDP."""

from __future__ import annotations

import json
import math
import pickle
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo
from _metric_references import prompt_rows as _rows
from _metric_references import ref_avg as _ref_avg
from _metric_references import ref_clip
from _metric_references import ref_pass as _ref_pass
from _metric_references import ref_token_entropy as _ref_token_entropy

from lit_entropy.metrics import AvgAtK, ClipRatio, PassAtK, TokenEntropy

EPS_LOW, EPS_HIGH = 0.2, 0.28
N_SAMPLES, K = 8, 4
# (B, T) of the token batches and the number of prompts of the prompt batches, per update.
TOKEN_SHAPES = [(2, 5), (3, 7), (1, 4), (4, 6)]
PROMPTS_PER_BATCH = [3, 2, 4, 1]


# --------------------------------------------------------------------------- data


def _dataset() -> dict[str, list[Any]]:
    """Deterministic batches for all four metrics (regenerated identically inside DDP workers)."""
    gen = torch.Generator().manual_seed(1234)
    entropy, clip, correct = [], [], []
    for i, (b, t) in enumerate(TOKEN_SHAPES):
        # NaN under the mask must be ignored, so plant some where the mask is False.
        values = torch.rand(b, t, generator=gen, dtype=torch.float64) * 3
        mask = torch.rand(b, t, generator=gen) < 0.7
        values[~mask] = float("nan") if i % 2 else 100.0
        entropy.append((values.to(torch.float32), mask))
        # float64 ratios so the Python reference compares exactly the same numbers.
        ratio = torch.exp(torch.randn(b, t, generator=gen, dtype=torch.float64) * 0.4)
        per_sequence = i % 2 == 0
        shape = (b,) if per_sequence else (b, t)
        advantages = torch.randn(*shape, generator=gen, dtype=torch.float64)
        clip.append((ratio, advantages, torch.rand(b, t, generator=gen) < 0.8))
    for p in PROMPTS_PER_BATCH:
        # Per-prompt success rates spread from 0 to 1 so c covers easy, hard and all-wrong prompts.
        rates = torch.rand(p, 1, generator=gen)
        if p == 2:
            # Pin one all-wrong and one all-right prompt (the n - c < k branch).
            rates[:, 0] = torch.tensor([0.0, 1.1])
        correct.append(torch.rand(p, N_SAMPLES, generator=gen) < rates)
    return {"entropy": entropy, "clip": clip, "correct": correct}


def _shard(data: dict[str, list[Any]], rank: int) -> dict[str, list[Any]]:
    """Rank 0 gets the first two batches of each kind, rank 1 the last two (whole prompt groups)."""
    return {name: batches[2 * rank : 2 * rank + 2] for name, batches in data.items()}


# --------------------------------------------------------------------------- plain-Python references


def _ref_clip(batches: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    return ref_clip(batches, EPS_LOW, EPS_HIGH)


def _references(data: dict[str, list[Any]]) -> dict[str, float]:
    rows = _rows(data["correct"])
    clip = _ref_clip(data["clip"])
    return {
        "entropy": _ref_token_entropy(data["entropy"]),
        "clip_low": clip["low"],
        "clip_high": clip["high"],
        "clip_total": clip["total"],
        "avg": _ref_avg(rows),
        "pass": _ref_pass(rows, K),
    }


def _run_metrics(data: dict[str, list[Any]], extra_empty_update: bool = False) -> dict[str, float]:
    """Stream every batch of ``data`` through fresh metrics and return their computed values."""
    entropy, clip, avg, pass_k = TokenEntropy(), ClipRatio(EPS_LOW, EPS_HIGH), AvgAtK(), PassAtK(K)
    for batch in data["entropy"]:
        entropy.update(*batch)
    for batch in data["clip"]:
        clip.update(*batch)
    for batch in data["correct"]:
        avg.update(batch)
        pass_k.update(batch)
    if extra_empty_update:
        # A rank that ends up with no prompts in a step must still be able to update and sync.
        avg.update(torch.zeros(0, N_SAMPLES, dtype=torch.bool))
        pass_k.update(torch.zeros(0, N_SAMPLES, dtype=torch.bool))
    clip_values = clip.compute()
    return {
        "entropy": entropy.compute().item(),
        "clip_low": clip_values["low"].item(),
        "clip_high": clip_values["high"].item(),
        "clip_total": clip_values["total"].item(),
        "avg": avg.compute().item(),
        "pass": pass_k.compute().item(),
    }


def _pad_cat(tensors: list[torch.Tensor], fill: float | bool) -> torch.Tensor:
    """Concatenate ``[B_i, T_i]`` tensors along the batch, right-padding T with ``fill``."""
    width = max(x.shape[1] for x in tensors)
    return torch.cat([torch.nn.functional.pad(x, (0, width - x.shape[1]), value=fill) for x in tensors])


def _one_shot(data: dict[str, list[Any]]) -> dict[str, Any]:
    """All batches of each kind merged into one batch (padding masked out)."""
    clip = data["clip"]
    advantages = [a.unsqueeze(1).expand_as(r) if a.ndim == 1 else a for r, a, _ in clip]
    return {
        "entropy": (
            _pad_cat([v for v, _ in data["entropy"]], 0.0),
            _pad_cat([m for _, m in data["entropy"]], False),
        ),
        "clip": (
            _pad_cat([r for r, _, _ in clip], 1.0),
            _pad_cat(advantages, 0.0),
            _pad_cat([m for _, _, m in clip], False),
        ),
        "correct": torch.cat(data["correct"]),
    }


def _approx(value: float) -> Any:
    return pytest.approx(value, rel=1e-12, abs=1e-12)


# --------------------------------------------------------------------------- single-process behaviour


def test_reference_values_are_not_degenerate() -> None:
    # Guards the other tests: the data must exercise both clip sides and a spread of c.
    ref = _references(_dataset())
    assert 0 < ref["clip_low"] < 1 and 0 < ref["clip_high"] < 1
    assert 0 < ref["avg"] < ref["pass"] < 1
    counts = {sum(row) for row in _rows(_dataset()["correct"])}
    assert len(counts) >= 5 and {0, N_SAMPLES} <= counts


def test_streaming_matches_reference() -> None:
    data = _dataset()
    assert _run_metrics(data) == {name: _approx(value) for name, value in _references(data).items()}


def test_one_shot_equals_streaming() -> None:
    data = _dataset()
    merged = _one_shot(data)
    entropy, clip, avg, pass_k = TokenEntropy(), ClipRatio(EPS_LOW, EPS_HIGH), AvgAtK(), PassAtK(K)
    entropy.update(*merged["entropy"])
    clip.update(*merged["clip"])
    avg.update(merged["correct"])
    pass_k.update(merged["correct"])
    streamed = _run_metrics(data)
    clip_values = clip.compute()
    assert entropy.compute().item() == _approx(streamed["entropy"])
    assert clip_values["low"].item() == _approx(streamed["clip_low"])
    assert clip_values["high"].item() == _approx(streamed["clip_high"])
    assert clip_values["total"].item() == _approx(streamed["clip_total"])
    assert avg.compute().item() == _approx(streamed["avg"])
    assert pass_k.compute().item() == _approx(streamed["pass"])


def test_forward_returns_batch_value_and_accumulates() -> None:
    # full_state_update=False: forward must give the batch-only value yet keep the global state.
    data = _dataset()
    metric = PassAtK(K)
    for batch in data["correct"]:
        assert metric(batch).item() == _approx(_ref_pass(batch.tolist(), K))
    assert metric.compute().item() == _approx(_ref_pass(_rows(data["correct"]), K))

    clip = ClipRatio(EPS_LOW, EPS_HIGH)
    for batch in data["clip"]:
        batch_value = clip(*batch)
        assert {name: value.item() for name, value in batch_value.items()} == {
            name: _approx(value) for name, value in _ref_clip([batch]).items()
        }
    assert clip.compute()["total"].item() == _approx(_ref_clip(data["clip"])["total"])

    entropy = TokenEntropy()
    for batch in data["entropy"]:
        assert entropy(*batch).item() == _approx(_ref_token_entropy([batch]))
    assert entropy.compute().item() == _approx(_ref_token_entropy(data["entropy"]))


def test_reset_forgets_earlier_updates() -> None:
    data = _dataset()
    first, second = _shard(data, 0), _shard(data, 1)
    metrics = {"entropy": TokenEntropy(), "clip": ClipRatio(EPS_LOW, EPS_HIGH), "avg": AvgAtK(), "pass": PassAtK(K)}
    for run in (first, second):
        for metric in metrics.values():
            metric.reset()
        for batch in run["entropy"]:
            metrics["entropy"].update(*batch)
        for batch in run["clip"]:
            metrics["clip"].update(*batch)
        for batch in run["correct"]:
            metrics["avg"].update(batch)
            metrics["pass"].update(batch)
        ref = _references(run)
        assert metrics["entropy"].compute().item() == _approx(ref["entropy"])
        assert metrics["clip"].compute()["total"].item() == _approx(ref["clip_total"])
        assert metrics["avg"].compute().item() == _approx(ref["avg"])
        assert metrics["pass"].compute().item() == _approx(ref["pass"])
    assert metrics["pass"].count.item() == sum(PROMPTS_PER_BATCH[2:])


def test_pickle_round_trip_keeps_state() -> None:
    data = _dataset()
    first, second = _shard(data, 0), _shard(data, 1)
    metric = PassAtK(K)
    for batch in first["correct"]:
        metric.update(batch)
    clone = pickle.loads(pickle.dumps(metric))
    assert clone.k == K
    assert clone.compute().item() == _approx(_ref_pass(_rows(first["correct"]), K))
    for batch in second["correct"]:
        clone.update(batch)
    assert clone.compute().item() == _approx(_ref_pass(_rows(data["correct"]), K))

    for fresh in (TokenEntropy(), ClipRatio(EPS_LOW, EPS_HIGH), AvgAtK()):
        fresh_clone = pickle.loads(pickle.dumps(fresh))
        assert type(fresh_clone) is type(fresh)
    clip = ClipRatio(EPS_LOW, EPS_HIGH)
    clip.update(*data["clip"][0])
    clip_clone = pickle.loads(pickle.dumps(clip))
    assert (clip_clone.clip_ratio_low, clip_clone.clip_ratio_high) == (EPS_LOW, EPS_HIGH)
    assert clip_clone.compute()["total"].item() == _approx(_ref_clip(data["clip"][:1])["total"])
    entropy = TokenEntropy()
    entropy.update(*data["entropy"][1])
    assert pickle.loads(pickle.dumps(entropy)).compute().item() == _approx(_ref_token_entropy(data["entropy"][1:2]))


@pytest.mark.filterwarnings("ignore:The ``compute`` method of metric PassAtK was called before")
def test_state_dict_empty_by_default_and_persistent_round_trip() -> None:
    data = _dataset()
    for metric in (TokenEntropy(), ClipRatio(), AvgAtK(), PassAtK(2)):
        assert metric.state_dict() == {}
    metric = PassAtK(K)
    metric.persistent(True)
    for batch in data["correct"]:
        metric.update(batch)
    state = metric.state_dict()
    assert set(state) == {"total", "count", "config"}
    restored = PassAtK(K)
    restored.persistent(True)
    restored.load_state_dict(state)
    assert restored.compute().item() == _approx(_ref_pass(_rows(data["correct"]), K))


def test_accumulators_stay_float64_under_module_casts() -> None:
    # Lightning's "bf16-true" precision calls module.to(dtype=torch.bfloat16) on the whole LightningModule.
    for metric, name in ((TokenEntropy(), "sum_entropy"), (AvgAtK(), "total"), (PassAtK(2), "total")):
        metric.half()
        metric.to(torch.bfloat16)
        metric.to("cpu", torch.float16)
        assert getattr(metric, name).dtype == torch.float64, type(metric)
        metric.reset()
        assert getattr(metric, name).dtype == torch.float64, type(metric)
    entropy = TokenEntropy().to(torch.bfloat16)
    # 1e8 + 1: a float32 (let alone bf16) accumulator would drop the 1.
    entropy.update(torch.tensor([[1e8]], dtype=torch.float64))
    entropy.update(torch.tensor([[1.0]], dtype=torch.float64))
    assert entropy.sum_entropy.item() == 100000001.0
    # An explicit set_dtype still converts, and device moves still apply to the kept states.
    assert PassAtK(2).set_dtype(torch.float32).total.dtype == torch.float32
    moved = AvgAtK().to("meta", torch.bfloat16)
    assert moved.total.device.type == "meta" and moved.total.dtype == torch.float64
    assert moved._defaults["total"].device.type == "meta"


def test_metric_collection_keeps_differently_configured_metrics_apart() -> None:
    # A degenerate first batch (all wrong, nothing clipped) makes every state equal; the default
    # compute groups of MetricCollection must still not fuse metrics with different settings.
    from torchmetrics import MetricCollection

    data = _dataset()
    passes = MetricCollection({"avg": AvgAtK(), "p1": PassAtK(1), "p2": PassAtK(2), "p4": PassAtK(4)})
    passes.update(torch.zeros(3, N_SAMPLES, dtype=torch.bool))
    for batch in data["correct"]:
        passes.update(batch)
    rows = [[False] * N_SAMPLES] * 3 + _rows(data["correct"])
    assert {name: value.item() for name, value in passes.compute().items()} == {
        "avg": _approx(_ref_avg(rows)),
        "p1": _approx(_ref_pass(rows, 1)),
        "p2": _approx(_ref_pass(rows, 2)),
        "p4": _approx(_ref_pass(rows, 4)),
    }

    clips = MetricCollection({"narrow": ClipRatio(0.1, 0.1), "wide": ClipRatio(EPS_LOW, EPS_HIGH)})
    ratio, advantages, mask = data["clip"][1]
    clips.update(torch.ones_like(ratio), advantages, mask)
    clips.update(ratio, advantages, mask)
    values = clips.compute()
    # Two updates over the same mask: the clipped fraction of the second is halved.
    assert values["wide_total"].item() == _approx(_ref_clip([(ratio, advantages, mask)])["total"] / 2)
    assert values["narrow_total"].item() > values["wide_total"].item()


def test_avg_at_k_equals_pass_at_1() -> None:
    data = _dataset()
    avg, pass_1 = AvgAtK(), PassAtK(1)
    for batch in data["correct"]:
        avg.update(batch)
        pass_1.update(batch)
    assert avg.compute().item() == _approx(pass_1.compute().item())


def test_ragged_counts_update() -> None:
    n_list, c_list = [4, 6, 9, 4, 12], [0, 3, 9, 1, 5]
    pass_k, avg = PassAtK(3), AvgAtK()
    pass_k.update(num_correct=torch.tensor(c_list[:2]), num_samples=torch.tensor(n_list[:2]))
    pass_k.update(num_correct=torch.tensor(c_list[2:]), num_samples=torch.tensor(n_list[2:]))
    avg.update(num_correct=torch.tensor(c_list), num_samples=torch.tensor(n_list))
    expected_pass = sum(1 - math.comb(n - c, 3) / math.comb(n, 3) for n, c in zip(n_list, c_list, strict=True)) / 5
    expected_avg = sum(c / n for n, c in zip(n_list, c_list, strict=True)) / 5
    assert pass_k.compute().item() == _approx(expected_pass)
    assert avg.compute().item() == _approx(expected_avg)


def test_clip_ratio_per_sequence_advantages_equal_expanded() -> None:
    ratio, advantages, mask = _dataset()["clip"][0]
    assert advantages.ndim == 1
    a, b = ClipRatio(EPS_LOW, EPS_HIGH), ClipRatio(EPS_LOW, EPS_HIGH)
    a.update(ratio, advantages, mask)
    b.update(ratio, advantages.unsqueeze(1).expand_as(ratio).contiguous(), mask)
    assert {k: v.item() for k, v in a.compute().items()} == {k: v.item() for k, v in b.compute().items()}
    # Without a mask every token counts.
    c = ClipRatio(EPS_LOW, EPS_HIGH)
    c.update(ratio, advantages)
    assert c.compute()["total"].item() == _approx(_ref_clip([(ratio, advantages, torch.ones_like(mask))])["total"])


def test_clip_ratio_thresholds_are_strict_and_asymmetric() -> None:
    ratio = torch.tensor([[0.8, 0.79, 1.2, 1.21, 1.28, 1.29]], dtype=torch.float64)
    metric = ClipRatio(clip_ratio_low=0.2, clip_ratio_high=0.28)
    metric.update(ratio, torch.tensor([[-1.0, -1.0, 1.0, 1.0, 1.0, 1.0]], dtype=torch.float64))
    values = metric.compute()
    assert values["low"].item() == _approx(1 / 6)  # only 0.79
    assert values["high"].item() == _approx(1 / 6)  # only 1.29
    metric.reset()
    # Zero advantages never count as clipped.
    metric.update(ratio, torch.zeros(1, dtype=torch.float64))
    assert metric.compute()["total"].item() == 0.0


def test_no_valid_data_gives_nan() -> None:
    entropy = TokenEntropy()
    entropy.update(torch.ones(2, 3), torch.zeros(2, 3, dtype=torch.bool))
    assert math.isnan(entropy.compute().item())
    clip = ClipRatio()
    clip.update(torch.ones(2, 3), torch.ones(2), torch.zeros(2, 3, dtype=torch.bool))
    assert all(math.isnan(v.item()) for v in clip.compute().values())
    pass_k = PassAtK(2)
    pass_k.update(torch.zeros(0, 4, dtype=torch.bool))
    assert math.isnan(pass_k.compute().item())


def test_token_entropy_ignores_gradients_and_any_float_dtype() -> None:
    values = torch.tensor([[0.5, 1.5, 2.5]], requires_grad=True)
    metric = TokenEntropy()
    metric.update(values.to(torch.bfloat16), torch.tensor([[True, True, False]]))
    assert not metric.compute().requires_grad
    assert metric.compute().item() == _approx(1.0)


def test_clip_ratio_output_returns_one_fraction() -> None:
    data = _dataset()
    ref = _ref_clip(data["clip"])
    for output in ("low", "high", "total"):
        metric = ClipRatio(EPS_LOW, EPS_HIGH, output=output)
        for batch in data["clip"]:
            metric.update(*batch)
        value = metric.compute()
        assert isinstance(value, torch.Tensor) and value.ndim == 0
        assert value.item() == _approx(ref[output])
    with pytest.raises(ValueError, match="output='region'"):
        ClipRatio(output="region")


def test_clip_ratio_outputs_share_one_compute_group() -> None:
    # Equal settings: MetricCollection fuses the three into one group and updates it once.
    from torchmetrics import MetricCollection

    data = _dataset()
    clips = MetricCollection(
        {name: ClipRatio(EPS_LOW, EPS_HIGH, output=name) for name in ("low", "high", "total")}, prefix="clip/"
    )
    for batch in data["clip"]:
        clips.update(*batch)
    assert [sorted(group) for group in clips.compute_groups.values()] == [["high", "low", "total"]]
    ref = _ref_clip(data["clip"])
    assert {k: v.item() for k, v in clips.compute().items()} == {f"clip/{k}": _approx(v) for k, v in ref.items()}


def _step_value(metric: Any) -> Any:
    """What Lightning 2.6 logs at step level for a metric object: ``self.log`` reads ``_forward_cache``."""
    return metric._forward_cache


def test_step_value_after_updates_covers_the_updates_since_the_last_read() -> None:
    data = _dataset()
    batches = data["entropy"]
    metric = TokenEntropy()
    assert _step_value(metric) is None
    metric.update(*batches[0])
    metric.update(*batches[1])
    assert _step_value(metric).item() == _approx(_ref_token_entropy(batches[:2]))
    # Reading again without updates gives the same value; the accumulated state is untouched.
    assert _step_value(metric).item() == _approx(_ref_token_entropy(batches[:2]))
    metric.update(*batches[2])
    assert _step_value(metric).item() == _approx(_ref_token_entropy(batches[2:3]))
    # forward keeps torchmetrics' meaning: that batch's value.
    assert metric(*batches[3]).item() == _approx(_ref_token_entropy(batches[3:]))
    assert _step_value(metric).item() == _approx(_ref_token_entropy(batches[3:]))
    assert metric.compute().item() == _approx(_ref_token_entropy(batches))
    # Updates after a forward count from the forward on.
    metric.update(*batches[0])
    assert _step_value(metric).item() == _approx(_ref_token_entropy(batches[:1]))
    metric.reset()
    assert _step_value(metric) is None


def test_step_value_survives_moves_pickling_and_sync_state() -> None:
    data = _dataset()
    metric = PassAtK(K)
    metric.update(data["correct"][0])
    _step_value(metric)
    metric.update(data["correct"][1])
    # A device/dtype move between updates neither computes nor restarts the window.
    metric.to(torch.bfloat16)
    metric.update(data["correct"][2])
    clone = pickle.loads(pickle.dumps(metric))
    expected = _ref_pass(_rows(data["correct"][1:3]), K)
    assert _step_value(clone).item() == _approx(expected)
    assert _step_value(metric).item() == _approx(expected)
    # The global value and compute cache are those of all updates.
    assert metric.compute().item() == _approx(_ref_pass(_rows(data["correct"][:3]), K))
    assert metric.total.dtype == torch.float64


def test_public_metrics_are_exported() -> None:
    import importlib
    import inspect
    import pkgutil

    from torchmetrics import Metric

    import lit_entropy.metrics as package

    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for name, obj in vars(module).items():
            public = not name.startswith("_") and not inspect.isabstract(obj)
            if inspect.isclass(obj) and issubclass(obj, Metric) and obj.__module__ == module.__name__ and public:
                found.add(name)
    assert found >= {"TokenEntropy", "ClipRatio", "AvgAtK", "PassAtK"}
    assert sorted(package.__all__) == sorted(found)
    for name in found:
        assert getattr(package, name).__module__.startswith(package.__name__)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.ones(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)), "entropy"),
        ((torch.ones(2, 3), torch.ones(2, 3)), "mask"),
        ((torch.ones(2, 3), torch.ones(2, 4, dtype=torch.bool)), "shape"),
    ],
)
def test_token_entropy_rejects_bad_input(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        TokenEntropy().update(*args)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((torch.ones(2, 3, dtype=torch.long), torch.ones(2)), "ratio"),
        ((torch.ones(2, 3), torch.ones(3)), "advantages"),
        ((torch.ones(2, 3), torch.ones(2, 4)), "advantages"),
        ((torch.ones(6), torch.ones(6)), "ratio"),
        ((torch.ones(2, 3), torch.ones(2), torch.ones(2, 3)), "mask"),
        ((torch.ones(2, 3), torch.ones(2), torch.ones(3, 2, dtype=torch.bool)), "mask"),
    ],
)
def test_clip_ratio_rejects_bad_input(args: tuple[Any, ...], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        ClipRatio().update(*args)


@pytest.mark.parametrize(
    "kwargs", [{"clip_ratio_low": -0.1}, {"clip_ratio_high": float("nan")}, {"clip_ratio_low": "a"}]
)
def test_clip_ratio_rejects_bad_epsilon(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ClipRatio(**kwargs)


def test_pass_at_k_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="k=0"):
        PassAtK(0)
    metric = PassAtK(4)
    with pytest.raises(ValueError, match=r"k=4.*n=3"):
        metric.update(torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="correct"):
        metric.update(torch.ones(8, dtype=torch.bool))
    with pytest.raises(ValueError, match="correct"):
        metric.update(torch.ones(2, 8))
    with pytest.raises(ValueError, match="not both"):
        metric.update(torch.ones(2, 8, dtype=torch.bool), num_correct=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="num_samples"):
        metric.update(num_correct=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="num_correct=9"):
        metric.update(num_correct=torch.tensor([9]), num_samples=torch.tensor([8]))
    with pytest.raises(ValueError, match="n=0"):
        AvgAtK().update(num_correct=torch.tensor([0]), num_samples=torch.tensor([0]))
    # A rejected update leaves the state untouched.
    assert metric.count.item() == 0 and metric.total.item() == 0.0


# --------------------------------------------------------------------------- DDP


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    torch.set_num_threads(1)
    init_gloo(rank, world_size, port)
    try:
        values = _run_metrics(_shard(_dataset(), rank), extra_empty_update=rank == 1)
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(values))
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_ddp_two_gloo_ranks_sync_to_full_data_value(tmp_path: Path) -> None:
    world_size = 2
    mp.spawn(_ddp_worker, args=(world_size, free_port(), str(tmp_path)), nprocs=world_size, join=True)
    data = _dataset()
    single_process = _run_metrics(data)
    reference = _references(data)
    # Each rank alone sees only half the data, so a missing sync would show up as a mismatch.
    assert _run_metrics(_shard(data, 0))["pass"] != _approx(reference["pass"])
    for rank in range(world_size):
        synced = json.loads(Path(tmp_path, f"rank{rank}.json").read_text())
        assert synced == {name: _approx(value) for name, value in single_process.items()}, rank
        assert synced == {name: _approx(value) for name, value in reference.items()}, rank

"""Pins lit_entropy.internals.torchmetrics: the torchmetrics hooks it overrides and Lightning's read of them."""

from __future__ import annotations

import inspect

import lightning
import torch
import torchmetrics
from lightning.pytorch.trainer.connectors.logger_connector import result
from torchmetrics import SumMetric
from torchmetrics.utilities.data import dim_zero_sum

from lit_entropy.internals.torchmetrics import Float64StateMetric, StepValueMetric

UPGRADE = (
    f"(torchmetrics {torchmetrics.__version__}, lightning {lightning.__version__}): "
    "update lit_entropy/internals/torchmetrics.py"
)


def test_lightning_logs_a_metric_object_per_step_from_forward_cache() -> None:
    source = inspect.getsource(result)
    assert "._forward_cache" in source, f"Lightning no longer reads Metric._forward_cache for step values {UPGRADE}"


def test_forward_cache_and_update_count_semantics() -> None:
    metric = SumMetric()
    assert metric._forward_cache is None and metric._update_count == 0, f"fresh metric bookkeeping {UPGRADE}"
    metric(torch.tensor(2.0))
    assert float(metric._forward_cache) == 2.0, f"forward no longer stores the batch value {UPGRADE}"
    metric.update(torch.tensor(3.0))
    assert metric._update_count == 2, f"_update_count no longer counts forward + update {UPGRADE}"
    assert float(metric._forward_cache) == 2.0, "update must leave the forward cache alone (the bug worked around)"
    metric.reset()
    assert metric._forward_cache is None and metric._update_count == 0, f"reset bookkeeping {UPGRADE}"


def test_state_bookkeeping_the_step_window_reads() -> None:
    metric = SumMetric()
    assert set(metric._defaults) == {"sum_value"} and metric._reductions["sum_value"] is dim_zero_sum, UPGRADE
    for name in ("_computed", "_to_sync", "_should_unsync", "_is_synced", "_dtype_convert"):
        assert hasattr(metric, name), f"Metric.{name} is gone {UPGRADE}"
    assert "exclude_state" in inspect.signature(metric._apply).parameters, f"Metric._apply signature {UPGRADE}"


class _Sum(Float64StateMetric):
    _float64_states = ("total",)

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, x: torch.Tensor) -> None:
        self.total += x.double().sum()

    def compute(self) -> torch.Tensor:
        return self.total


def test_the_adapters_work_on_the_installed_versions() -> None:
    metric = _Sum()
    assert isinstance(metric, StepValueMetric)
    metric.update(torch.tensor([1.0, 2.0]))
    metric.update(torch.tensor([4.0]))
    assert float(metric._forward_cache) == 7.0, f"step value after direct updates {UPGRADE}"
    metric.update(torch.tensor([0.5]))
    assert float(metric._forward_cache) == 0.5, f"the window restarts at each read {UPGRADE}"
    metric.to(torch.bfloat16)
    assert metric.total.dtype == torch.float64 and float(metric.compute()) == 7.5, f"float64 state under .to {UPGRADE}"

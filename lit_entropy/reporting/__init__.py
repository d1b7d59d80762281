"""What a run shows: the training dashboard (``train/*``, ``perf/*``), evaluation metrics (``val/*``), the
HPARAMS tab, console lines, and the small-sample statistics reports and benchmarks quote.

Members load lazily, so that scripts can import ``lit_entropy.reporting.statistics`` without Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ConsoleMetrics": "lit_entropy.reporting.console",
    "HParamsSummary": "lit_entropy.reporting.hparams",
    "OverviewLayout": "lit_entropy.reporting.overview",
    "SampleEvaluator": "lit_entropy.reporting.evaluation",
    "TagPlan": "lit_entropy.reporting.dashboard",
    "TrainDashboard": "lit_entropy.reporting.dashboard",
    "evaluation_tags": "lit_entropy.reporting.evaluation",
}

__all__ = [
    "ConsoleMetrics",
    "HParamsSummary",
    "OverviewLayout",
    "SampleEvaluator",
    "TagPlan",
    "TrainDashboard",
    "evaluation_tags",
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'lit_entropy.reporting' has no attribute {name!r}")

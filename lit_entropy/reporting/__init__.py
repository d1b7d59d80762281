"""What a run shows: the training dashboard (``train/*``, ``perf/*``), evaluation metrics (``val/*``), the
HPARAMS tab and console lines.

Members load lazily: importing one member does not load Lightning for the others.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "ConsoleMetrics": "lit_entropy.reporting.console",
    "HParamsSummary": "lit_entropy.reporting.hparams",
    "OverviewLayout": "lit_entropy.reporting.overview",
    "SampleEvaluator": "lit_entropy.reporting.evaluation",
    "TagPlan": "lit_entropy.reporting.tag_plan",
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

"""What a run shows: the training dashboard (``train/*``, ``perf/*``), evaluation metrics (``val/*``), the
HPARAMS tab and console lines."""

from lit_entropy.reporting.console import ConsoleMetrics
from lit_entropy.reporting.dashboard import TagPlan, TrainDashboard
from lit_entropy.reporting.evaluation import SampleEvaluator, evaluation_tags
from lit_entropy.reporting.hparams import HParamsSummary

__all__ = ["ConsoleMetrics", "HParamsSummary", "SampleEvaluator", "TagPlan", "TrainDashboard", "evaluation_tags"]

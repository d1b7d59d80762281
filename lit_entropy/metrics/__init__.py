"""torchmetrics metrics for RL fine-tuning: token entropy, clip fractions, Pass@K and Avg@K."""

from lit_entropy.metrics.clip_ratio import ClipRatio
from lit_entropy.metrics.loss_clip import LossClipFractions
from lit_entropy.metrics.pass_at_k import AvgAtK, PassAtK
from lit_entropy.metrics.token_entropy import TokenEntropy

__all__ = ["AvgAtK", "ClipRatio", "LossClipFractions", "PassAtK", "TokenEntropy"]

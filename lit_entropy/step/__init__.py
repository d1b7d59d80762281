"""Lightning-free pieces of one RL training step: forward statistics, experience, loss, update schedule.

:class:`~lit_entropy.module.RFTModule` composes them; each is importable and testable without a Trainer.
"""

from lit_entropy.step.experience import (
    Experience,
    RolloutStatistics,
    advantage_options,
    build_experience,
    rollout_mismatch,
    token_advantages,
)
from lit_entropy.step.forward import ResponseForward, response_forward, response_logits, value_estimates
from lit_entropy.step.loss import (
    SHARE_TERMS,
    UpdateLoss,
    UpdateTerms,
    global_loss_normalizer,
    resolved_agg_mode,
    rows_update_loss,
    update_loss,
)
from lit_entropy.step.schedule import (
    build_optimizer,
    clip_grad_norm_and_agree,
    lr_multiplier,
    row_slices,
    single_update,
    updates_per_batch,
)

__all__ = [
    "SHARE_TERMS",
    "Experience",
    "ResponseForward",
    "RolloutStatistics",
    "UpdateLoss",
    "UpdateTerms",
    "advantage_options",
    "build_experience",
    "build_optimizer",
    "clip_grad_norm_and_agree",
    "global_loss_normalizer",
    "lr_multiplier",
    "resolved_agg_mode",
    "response_forward",
    "response_logits",
    "row_slices",
    "rows_update_loss",
    "single_update",
    "rollout_mismatch",
    "token_advantages",
    "update_loss",
    "updates_per_batch",
    "value_estimates",
]

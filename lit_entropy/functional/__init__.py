"""Pure tensor functions of lit_entropy (no Lightning): entropy dynamics, losses, masks, metrics.

Per-token tensors are ``[batch, response_len]`` with a bool ``mask`` (True = real response token).
"""

from lit_entropy.functional.advantages import (
    ADVANTAGE_SCALES,
    check_advantage_scale,
    check_gae_args,
    gae_advantages,
    gae_estimator,
    grpo_advantages,
    grpo_estimator,
    whiten,
)
from lit_entropy.functional.advantages_reinforce import (
    discounted_returns,
    reinforce_plus_plus_baseline_estimator,
    reinforce_plus_plus_estimator,
    rloo_estimator,
)
from lit_entropy.functional.clipping import (
    cap_count,
    check_clip_b_args,
    check_clip_v_args,
    check_max_frac,
    clip_b_mask,
    clip_v_deviation,
    clip_v_mask,
    clip_v_scores,
    moment_stats,
)
from lit_entropy.functional.covariance import check_clip_cov_args, check_high_entropy_args, check_kl_cov_args
from lit_entropy.functional.entropy import (
    EntropyStats,
    entropy_discriminator,
    entropy_from_logits,
    entropy_stats,
    predicted_entropy_change,
)
from lit_entropy.functional.entropy_bonus import adaptive_entropy_coef, check_adaptive_entropy_args
from lit_entropy.functional.kl import KL_KINDS, check_kl_type, kl_penalty
from lit_entropy.functional.linear_entropy import linear_entropy_stats
from lit_entropy.functional.linear_entropy_loss import linear_entropy_loss
from lit_entropy.functional.masked import masked_mean, masked_moments, masked_sum
from lit_entropy.functional.overlong import check_overlong_args, overlong_penalty, truncated_rows
from lit_entropy.functional.pass_at_k import avg_at_k, pass_at_k, pass_at_k_per_prompt
from lit_entropy.functional.policy_loss import (
    LOSS_AGG_MODES,
    PolicyLossStats,
    aggregate_loss,
    check_policy_loss_args,
    check_value_loss_args,
    clipped_token_masks,
    policy_loss,
    ppo_policy_loss,
    value_loss,
)
from lit_entropy.functional.policy_loss_cispo import cispo_policy_loss
from lit_entropy.functional.policy_losses_sequence import (
    gmpo_policy_loss,
    gspo_policy_loss,
    gspo_token_policy_loss,
    masked_sequence_log_ratio,
    sequence_log_ratio,
)
from lit_entropy.functional.registry import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    Registry,
    UnknownNameError,
    check_group_size,
    default_loss_agg_mode,
    estimator_min_group_size,
    estimator_needs_values,
    outcome_token_rewards,
    policy_loss_attribute,
    register_advantage_estimator,
    register_policy_loss,
)
from lit_entropy.functional.sampling import CategoricalSampler, sample_categorical
from lit_entropy.functional.selection import (
    TopKCut,
    kth_largest,
    local_top_scores,
    tie_counts,
    top_k_cut,
    top_k_mask,
)

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "ADVANTAGE_SCALES",
    "CategoricalSampler",
    "EntropyStats",
    "KL_KINDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLossStats",
    "Registry",
    "TopKCut",
    "UnknownNameError",
    "adaptive_entropy_coef",
    "aggregate_loss",
    "avg_at_k",
    "cap_count",
    "check_adaptive_entropy_args",
    "check_advantage_scale",
    "check_clip_b_args",
    "check_clip_cov_args",
    "check_clip_v_args",
    "check_gae_args",
    "check_high_entropy_args",
    "check_kl_cov_args",
    "check_kl_type",
    "check_max_frac",
    "check_overlong_args",
    "check_policy_loss_args",
    "check_value_loss_args",
    "cispo_policy_loss",
    "clip_b_mask",
    "clip_v_deviation",
    "clip_v_mask",
    "clip_v_scores",
    "clipped_token_masks",
    "discounted_returns",
    "entropy_discriminator",
    "entropy_from_logits",
    "entropy_stats",
    "check_group_size",
    "default_loss_agg_mode",
    "estimator_min_group_size",
    "estimator_needs_values",
    "gae_advantages",
    "gae_estimator",
    "gmpo_policy_loss",
    "grpo_advantages",
    "grpo_estimator",
    "gspo_policy_loss",
    "gspo_token_policy_loss",
    "kl_penalty",
    "kth_largest",
    "linear_entropy_loss",
    "linear_entropy_stats",
    "local_top_scores",
    "masked_mean",
    "masked_moments",
    "masked_sum",
    "moment_stats",
    "outcome_token_rewards",
    "policy_loss_attribute",
    "overlong_penalty",
    "pass_at_k",
    "pass_at_k_per_prompt",
    "policy_loss",
    "ppo_policy_loss",
    "predicted_entropy_change",
    "register_advantage_estimator",
    "register_policy_loss",
    "reinforce_plus_plus_baseline_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
    "sample_categorical",
    "masked_sequence_log_ratio",
    "sequence_log_ratio",
    "tie_counts",
    "truncated_rows",
    "top_k_cut",
    "top_k_mask",
    "value_loss",
    "whiten",
]

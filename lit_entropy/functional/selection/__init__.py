"""Which tokens stay in the loss: exact top-k selection with a shard-independent tie-break (:mod:`.top_k`) and the
entropy-control rules built on it: Clip_B / Clip_V (:mod:`.clipping`, THEORY.md section 3) and Clip-Cov / KL-Cov /
high-entropy 80/20 (:mod:`.covariance`). Each returns a keep mask (or per-token coefficients) from per-token scores.
"""

from lit_entropy.functional.selection.clipping import (
    cap_count,
    check_clip_b_args,
    check_clip_v_args,
    check_max_frac,
    clip_b_mask,
    clip_v_deviation,
    clip_v_mask,
    clip_v_scores,
    finite_mask,
    moment_stats,
)
from lit_entropy.functional.selection.covariance import (
    check_clip_cov_args,
    check_clip_cov_bounds,
    check_high_entropy_args,
    check_kl_cov_args,
    clip_cov_candidates,
    clip_cov_mask,
    covariance_scores,
    high_entropy_count,
    high_entropy_mask,
    kl_cov_coefficients,
    random_global_picks,
    selection_count,
)
from lit_entropy.functional.selection.top_k import (
    TopKCut,
    kth_largest,
    local_top_scores,
    tie_counts,
    top_k_cut,
    top_k_mask,
)

__all__ = [
    "TopKCut",
    "cap_count",
    "check_clip_b_args",
    "check_clip_cov_args",
    "check_clip_cov_bounds",
    "check_clip_v_args",
    "check_high_entropy_args",
    "check_kl_cov_args",
    "check_max_frac",
    "clip_b_mask",
    "clip_cov_candidates",
    "clip_cov_mask",
    "clip_v_deviation",
    "clip_v_mask",
    "clip_v_scores",
    "covariance_scores",
    "finite_mask",
    "high_entropy_count",
    "high_entropy_mask",
    "kl_cov_coefficients",
    "kth_largest",
    "local_top_scores",
    "moment_stats",
    "random_global_picks",
    "selection_count",
    "tie_counts",
    "top_k_cut",
    "top_k_mask",
]

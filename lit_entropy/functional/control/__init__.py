"""Entropy-control methods that build on the entropy-discriminator paper (issue 38), as pure tensor math.

One module per method; each states its source (the authors' code, or the paper's equation where only the paper
is public) next to the formula. The token callbacks in :mod:`lit_entropy.callbacks` run them once per rollout
batch with global statistics; these functions are the single-process math the tests check against float64
re-derivations of the references.

- :mod:`~lit_entropy.functional.control.stare`: STARE's surprisal-ranked token weights and its entropy gate.
- :mod:`~lit_entropy.functional.control.entrocraft`: Entrocraft's entropy band and advantage switching.
- :mod:`~lit_entropy.functional.control.spurious`: STAPO's S2T mask of spurious tokens.
- :mod:`~lit_entropy.functional.control.reweighting`: probability-linear advantage reweighting (AR-Lopti).
- :mod:`~lit_entropy.functional.control.unlikeliness`: the unlikeliness reward (rank-scaled rewards, then GRPO).
- :mod:`~lit_entropy.functional.control.repo`: REPO-R's centred log-probability correction with adaptive zeta.
"""

from lit_entropy.functional.control.entrocraft import (
    check_entrocraft_args,
    entrocraft_advantages,
    entrocraft_bounds,
    entrocraft_phase,
)
from lit_entropy.functional.control.repo import check_repo_r_args, repo_r_advantages, repo_r_zeta
from lit_entropy.functional.control.reweighting import check_reweighting_args, reweighted_advantages
from lit_entropy.functional.control.spurious import check_s2t_args, interpolated_quantile, s2t_mask
from lit_entropy.functional.control.stare import (
    StareState,
    check_stare_args,
    stare_controller_step,
    stare_selection_count,
    stare_weights,
)
from lit_entropy.functional.control.unlikeliness import (
    check_unlikeliness_args,
    sequence_mean_logprobs,
    unlikeliness_advantages,
    unlikeliness_rewards,
)

__all__ = [
    "StareState",
    "check_entrocraft_args",
    "check_repo_r_args",
    "check_reweighting_args",
    "check_s2t_args",
    "check_stare_args",
    "check_unlikeliness_args",
    "entrocraft_advantages",
    "entrocraft_bounds",
    "entrocraft_phase",
    "interpolated_quantile",
    "repo_r_advantages",
    "repo_r_zeta",
    "reweighted_advantages",
    "s2t_mask",
    "sequence_mean_logprobs",
    "stare_controller_step",
    "stare_selection_count",
    "stare_weights",
    "unlikeliness_advantages",
    "unlikeliness_rewards",
]

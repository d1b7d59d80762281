"""Losses of the update: the policy losses of the registry, the critic's value loss, the KL penalty, and the
aggregation of a per-token loss into one scalar.

One module per concept: :mod:`.ratio` (the importance ratio and what every policy loss shares around it),
:mod:`.aggregation`, :mod:`.ppo`, :mod:`.sequence` (GSPO, GSPO-token, GMPO), :mod:`.cispo`, :mod:`.sapo`,
:mod:`.dppo` (DPPO-Binary TV / KL), :mod:`.ce_gppo`, :mod:`.value`,
:mod:`.kl`. A new policy loss is a new module here with one function decorated by
:func:`~lit_entropy.functional.registry.register_policy_loss`, imported below (the import registers it; the
import order is the registry's order).
"""

from lit_entropy.functional.losses.aggregation import (
    LOSS_AGG_MODES,
    aggregate_loss,
    aggregation_options,
    loss_normalizer_count,
)
from lit_entropy.functional.losses.ratio import (
    LOG_RATIO_CLAMP,
    PolicyLossStats,
    check_clip_ratios,
    check_policy_loss_args,
    clip_indicator_stats,
    clipped_token_masks,
    prepare_ratio_inputs,
    token_advantages,
)

# isort: off
# The registry lists the policy losses in the order these imports register them: ppo first.
from lit_entropy.functional.losses.ppo import policy_loss, ppo_policy_loss
from lit_entropy.functional.losses.sequence import (
    gmpo_policy_loss,
    gspo_policy_loss,
    gspo_token_policy_loss,
    masked_sequence_log_ratio,
    sequence_log_ratio,
)
from lit_entropy.functional.losses.cispo import cispo_policy_loss
from lit_entropy.functional.losses.sapo import sapo_policy_loss
from lit_entropy.functional.losses.dppo import binary_kl, dppo_kl_policy_loss, dppo_tv_policy_loss
from lit_entropy.functional.losses.ce_gppo import ce_gppo_policy_loss

# isort: on
from lit_entropy.functional.losses.kl import KL_KINDS, check_kl_type, kl_penalty
from lit_entropy.functional.losses.value import check_value_loss_args, value_loss

__all__ = [
    "KL_KINDS",
    "LOG_RATIO_CLAMP",
    "LOSS_AGG_MODES",
    "PolicyLossStats",
    "aggregate_loss",
    "aggregation_options",
    "binary_kl",
    "ce_gppo_policy_loss",
    "check_clip_ratios",
    "check_kl_type",
    "check_policy_loss_args",
    "check_value_loss_args",
    "cispo_policy_loss",
    "clip_indicator_stats",
    "clipped_token_masks",
    "dppo_kl_policy_loss",
    "dppo_tv_policy_loss",
    "gmpo_policy_loss",
    "gspo_policy_loss",
    "gspo_token_policy_loss",
    "kl_penalty",
    "loss_normalizer_count",
    "masked_sequence_log_ratio",
    "policy_loss",
    "ppo_policy_loss",
    "prepare_ratio_inputs",
    "sapo_policy_loss",
    "sequence_log_ratio",
    "token_advantages",
    "value_loss",
]

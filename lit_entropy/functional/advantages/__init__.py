"""Advantage estimators of the registry: one module per estimator family, sharing :mod:`.inputs` and
:mod:`.whitening`.

A new estimator is a new module here with one function decorated by
:func:`~lit_entropy.functional.registry.register_advantage_estimator`, imported below (the import registers it;
the import order is the registry's order).
"""

from lit_entropy.functional.advantages.inputs import as_floating, check_token_shapes, on_valid_tokens
from lit_entropy.functional.advantages.whitening import whiten

# isort: off
# The registry lists the estimators in the order these imports register them: grpo first.
from lit_entropy.functional.advantages.grpo import (
    ADVANTAGE_SCALES,
    check_advantage_scale,
    grpo_advantages,
    grpo_estimator,
)
from lit_entropy.functional.advantages.gae import check_gae_args, gae_advantages, gae_estimator
from lit_entropy.functional.advantages.reinforce import (
    discounted_returns,
    reinforce_plus_plus_baseline_estimator,
    reinforce_plus_plus_estimator,
    rloo_estimator,
)
from lit_entropy.functional.advantages.peers import (
    gdpo_estimator,
    grpo_passk_advantages,
    grpo_passk_estimator,
    opo_advantages,
    opo_estimator,
    remax_advantages,
    remax_estimator,
)

# isort: on

__all__ = [
    "ADVANTAGE_SCALES",
    "as_floating",
    "check_advantage_scale",
    "check_gae_args",
    "check_token_shapes",
    "discounted_returns",
    "gae_advantages",
    "gae_estimator",
    "gdpo_estimator",
    "grpo_advantages",
    "grpo_estimator",
    "grpo_passk_advantages",
    "grpo_passk_estimator",
    "on_valid_tokens",
    "opo_advantages",
    "opo_estimator",
    "reinforce_plus_plus_baseline_estimator",
    "remax_advantages",
    "remax_estimator",
    "reinforce_plus_plus_estimator",
    "rloo_estimator",
    "whiten",
]

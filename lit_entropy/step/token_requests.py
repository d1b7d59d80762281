"""What a rollout batch asks of the token callbacks (:mod:`lit_entropy.protocol`), applied to its experience."""

from __future__ import annotations

from typing import Any

from lit_entropy import protocol
from lit_entropy.step.experience import Experience

__all__ = ["apply_token_requests"]


def apply_token_requests(trainer: Any, pl_module: Any, experience: Experience) -> Experience:
    """Advantages first, then loss coefficients, keep masks and token penalties, from every rank's callbacks.

    The advantage providers run first so that the masks, penalties and observers see the advantages the loss
    will use. ``pl_module.loss_coefficients()`` gives the coefficients' configured values, which providers may
    override for this batch.

    Returns:
        ``experience`` with ``advantages`` (when a provider changed them), ``coefficients``, ``loss_mask`` and
        ``penalty`` set.
    """
    context = experience.token_context()
    advantages = protocol.collect_token_advantages(trainer, pl_module, context)
    if advantages is not None:
        experience.advantages = advantages
        context = experience.token_context()
    experience.coefficients = {
        **pl_module.loss_coefficients(),
        **protocol.collect_loss_coefficients(trainer, pl_module, context),
    }
    experience.loss_mask = protocol.collect_keep_mask(trainer, pl_module, context)
    experience.penalty = protocol.collect_token_penalty(trainer, pl_module, context)
    return experience

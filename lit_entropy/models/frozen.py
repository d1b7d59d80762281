"""The frozen weights an :class:`~lit_entropy.module.RFTModule` keeps out of its checkpoints.

The KL term's reference model and a LoRA policy's base never train: they are reloaded from
``model.policy.model_name_or_path`` rather than written into every checkpoint. Saving drops their entries; loading
puts the freshly loaded ones back, so a strict state-dict load (FSDP2's) finds every key.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor, nn

from lit_entropy.models.lora import is_frozen_base_key

__all__ = ["drop_frozen_weights", "is_frozen_weight", "restore_frozen_weights"]


def is_frozen_weight(key: str, lora: bool) -> bool:
    """Whether ``key`` (a module state-dict key) is frozen: the reference model's, or a LoRA policy's base."""
    if key.startswith("ref_model."):
        return True
    return lora and key.startswith("policy.") and is_frozen_base_key(key)


def drop_frozen_weights(checkpoint: dict[str, Any], lora: bool) -> None:
    """Delete the frozen entries from ``checkpoint["state_dict"]`` (in place; no state dict, nothing to do)."""
    state = checkpoint.get("state_dict", {})
    for key in [k for k in state if is_frozen_weight(k, lora)]:
        del state[key]


def restore_frozen_weights(
    checkpoint: dict[str, Any], ref_model: nn.Module | None, policy: nn.Module | None, *, lora: bool, strict: bool
) -> None:
    """Put the loaded frozen weights into ``checkpoint["state_dict"]`` (in place) before Lightning loads it.

    Args:
        checkpoint: the checkpoint being loaded.
        ref_model: the frozen reference model, if any: all its weights are added.
        policy: the policy as loaded from disk: with ``lora`` and ``strict``, its frozen base weights are added
            where the checkpoint lacks them.
        lora: whether the policy has LoRA adapters.
        strict: whether the module loads its state strictly (a non-strict load needs no frozen entry).
    """
    state: dict[str, Tensor] = checkpoint.setdefault("state_dict", {})
    if ref_model is not None:
        state.update({f"ref_model.{k}": v for k, v in ref_model.state_dict().items()})
    if strict and policy is not None and lora:
        base = {f"policy.{k}": v for k, v in policy.state_dict().items()}  # as loaded from disk
        state.update({k: v for k, v in base.items() if is_frozen_weight(k, lora) and k not in state})

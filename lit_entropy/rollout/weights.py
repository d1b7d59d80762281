"""Streaming a policy's weights into a rollout engine: Hugging Face names, one full tensor at a time, and the
agreement of all ranks on whether a push succeeded."""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from lit_entropy.distributed.collectives import all_gather_counts
from lit_entropy.models.lora import has_lora, lora_scalings, merged_weights

__all__ = ["default_enforce_eager", "drain", "failed_ranks", "hf_weight_name", "iter_hf_weights"]

# Wrapper names that FSDP1, activation checkpointing and torch.compile insert anywhere in a parameter name.
_WRAPPER_INFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def hf_weight_name(name: str) -> str:
    """The Hugging Face checkpoint name of a (possibly wrapped) module's state-dict key.

    Strips FSDP1 / activation-checkpointing / ``torch.compile`` wrapper segments anywhere in the name and
    leading DDP ``module.`` prefixes, e.g. ``module._orig_mod.model._fsdp_wrapped_module.norm.weight`` ->
    ``model.norm.weight``.
    """
    for infix in _WRAPPER_INFIXES:
        name = name.replace(infix, "")
    while name.startswith("module."):
        name = name[len("module.") :]
    return name


def _full(tensor: Tensor) -> Tensor:
    """The whole tensor: all-gathers an FSDP2 ``DTensor`` shard (a collective: every rank must call it)."""
    full_tensor = getattr(tensor, "full_tensor", None)
    return full_tensor() if callable(full_tensor) else tensor


def iter_hf_weights(policy: nn.Module) -> Iterator[tuple[str, Tensor]]:
    """Yield ``(HF name, full tensor)`` for every state-dict entry of ``policy``, one tensor at a time.

    ``state_dict()`` only holds references (shards for FSDP2); each full tensor is materialised right before
    it is yielded, so at most one gathered tensor is alive per step of the consumer. When the model ties its
    input and output embeddings but the state dict has no ``lm_head.weight`` (some wrappers de-duplicate
    tied parameters), the embedding is yielded a second time under that name, right after itself.
    """
    config = getattr(policy, "config", None)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    embed_name = None
    get_embeddings = getattr(policy, "get_input_embeddings", None)
    if tied and callable(get_embeddings):
        weight = get_embeddings().weight
        embed_name = next((hf_weight_name(n) for n, p in policy.named_parameters() if p is weight), None)
    emitted_head = False
    items: Iterator[tuple[str, Tensor]] = ((hf_weight_name(n), t) for n, t in policy.state_dict().items())
    if has_lora(policy):  # vLLM serves the merged weights W + alpha / r * B @ A under the plain names
        items = merged_weights(items, lora_scalings(policy, hf_weight_name), full=_full)
    for name, tensor in items:
        if name == "lm_head.weight":
            if emitted_head:
                # Already yielded as the tied embedding; the collective full_tensor() is still due on every rank.
                _full(tensor)
                continue
            emitted_head = True
        full = _full(tensor)
        yield name, full
        if name == embed_name and not emitted_head:
            emitted_head = True
            yield "lm_head.weight", full


def default_enforce_eager(device_type: str, enforce_eager: bool | None) -> bool:
    """``enforce_eager``, or when None: eager everywhere but CUDA, where CUDA graphs make decoding much faster."""
    return device_type != "cuda" if enforce_eager is None else enforce_eager


def drain(weights: Iterator[tuple[str, Tensor]]) -> None:
    """Run the rest of a failed push's weight iterator: its all-gathers are collectives the other ranks are in."""
    try:
        with torch.no_grad():
            for _ in weights:
                pass
    except Exception:  # noqa: BLE001 - the push already failed; its error is the one reported
        pass


def failed_ranks(failed: bool) -> list[int]:
    """The ranks whose push failed (every rank must call it under ``torch.distributed``)."""
    if not (dist.is_available() and dist.is_initialized()):
        return [0] if failed else []
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flags = all_gather_counts(int(failed), device or torch.device("cpu"))
    return [rank for rank, flag in enumerate(flags) if flag]

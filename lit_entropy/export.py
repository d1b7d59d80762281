"""Export a trained policy as a Hugging Face ``save_pretrained`` directory (loads with transformers and vLLM)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lit_entropy.checkpointing import atomic_directory_replace
from lit_entropy.distributed import full_state_dict, unwrapped_class

__all__ = ["export_hf_model", "export_module_policy"]


def export_hf_model(policy: nn.Module, tokenizer: Any, path: str | Path, *, write: bool = True) -> Path:
    """Write ``policy`` (``save_pretrained``) and ``tokenizer`` to ``path``, atomically.

    Under FSDP2 every rank must call it: the full weights are gathered collectively; only the rank with
    ``write=True`` (rank 0) writes.

    Args:
        policy: a Hugging Face causal LM, possibly sharded with ``fully_shard``.
        tokenizer: its tokenizer (anything with ``save_pretrained``).
        path: the target directory (replaced atomically).
        write: False on the ranks that only take part in the gather.

    Returns:
        The target directory.
    """
    state = full_state_dict(policy)  # collective under FSDP2
    tied = getattr(policy, "_tied_weights_keys", None)
    if isinstance(tied, dict) and getattr(policy.config, "tie_word_embeddings", False):
        # gathered shards are separate tensors: drop the tied copies the loader re-ties
        for key, source in tied.items():
            if key in state and source in state and torch.equal(state[key], state[source]):
                del state[key]
    if not write:
        return Path(path)

    def build(tmp: Path) -> None:
        config = policy.config
        use_cache, config.use_cache = config.use_cache, True  # training turns the KV cache off
        try:
            policy.save_pretrained(tmp, state_dict=state)
        finally:
            config.use_cache = use_cache
        tokenizer.save_pretrained(tmp)
        # fully_shard renames the class (FSDP<Name>); loaders pick the architecture by this name.
        config_file = tmp / "config.json"
        saved = json.loads(config_file.read_text())
        saved["architectures"] = [unwrapped_class(policy).__name__]
        config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")

    return atomic_directory_replace(build, path)


def export_module_policy(module: Any, path: str | Path | None, trainer: Any) -> str:
    """Export an :class:`~lit_entropy.module.RFTModule`'s policy; every rank calls it, rank 0 writes.

    Args:
        module: the module.
        path: target directory; None = ``<log_dir>/hf_model`` of ``trainer``.
        trainer: the Trainer the module is attached to, or None (then ``path`` is required).
    """
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    from lit_entropy.models import load_tokenizer

    if path is None and trainer is None:
        raise ValueError("export_pretrained needs a path when the module is not attached to a Trainer")
    if path is None:
        path = f"{trainer.log_dir or trainer.default_root_dir}/hf_model"
    if trainer is not None:
        path = trainer.strategy.broadcast(str(path))
    tokenizer = module.tokenizer or load_tokenizer(module.model_name_or_path)
    export_hf_model(module.policy, tokenizer, path, write=module.global_rank == 0)
    if trainer is not None:
        trainer.strategy.barrier("export_pretrained")
    rank_zero_info(f"lit_entropy: exported the policy to {path}")
    return str(path)

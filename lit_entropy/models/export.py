"""Export a policy as a Hugging Face ``save_pretrained`` directory, without ever deleting a user's files.

``export_hf_model`` writes the weights, config and tokenizer into a sibling temporary directory, then
swaps it in atomically (:func:`lit_entropy.checkpointing.atomic_directory_replace`). The directory is
marked with :data:`EXPORT_MARKER`, so a later export may replace a previous export of this library; any
other non-empty directory is refused unless ``overwrite=True`` (``lit-entropy export --overwrite``).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from lit_entropy import __version__
from lit_entropy.models.loading import load_tokenizer
from lit_entropy.models.lora import has_lora, lora_scalings, merged_weights, save_adapter

__all__ = [
    "EXPORT_MARKER",
    "check_export_target",
    "default_export_dir",
    "export_hf_model",
    "export_policy",
    "exports_at_train_end",
    "is_export",
]

#: File written into every export; its presence allows the next export to replace the directory.
EXPORT_MARKER = ".lit_entropy_export.json"


def is_export(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a directory written by :func:`export_hf_model` (it holds the marker file)."""
    return (Path(path) / EXPORT_MARKER).is_file()


def check_export_target(path: str | os.PathLike, *, overwrite: bool = False, setting: str = "--out") -> Path:
    """Refuse an export target that would destroy data; returns it as a ``Path``.

    Accepted: a path that does not exist, an empty directory, a previous export of this library (marker
    file present), or any directory when ``overwrite`` is True. Refused: a file, or a non-empty directory
    of something else.

    Raises:
        FileExistsError: Naming ``setting``, the path, a few of its entries and how to proceed.
    """
    target = Path(path).expanduser()
    if not target.exists() and not target.is_symlink():
        return target
    if not target.is_dir():
        raise FileExistsError(
            f"{setting}={str(path)!r} is an existing file, not a directory; the export needs a directory. "
            "Choose another path"
        )
    entries = sorted(p.name for p in target.iterdir())
    if not entries or overwrite or EXPORT_MARKER in entries:
        return target
    shown = ", ".join(entries[:5]) + (f", ... ({len(entries)} entries)" if len(entries) > 5 else "")
    raise FileExistsError(
        f"{setting}={str(path)!r} is a non-empty directory that is not a lit_entropy export ({shown}); "
        "refusing to replace it. Choose a new or empty directory, or pass --overwrite (export_hf_model("
        "overwrite=True)) to delete its contents and write the export there"
    )


def export_hf_model(
    policy: Any,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    overwrite: bool = False,
    write: bool = True,
    setting: str = "--out",
    merge: bool = False,
) -> Path:
    """Write ``policy`` (``save_pretrained``) and ``tokenizer`` to ``path`` atomically; returns the path.

    A LoRA policy (``model.policy.lora``) is written as a peft adapter directory (``adapter_config.json`` +
    ``adapter_model.safetensors``, loaded with ``peft.PeftModel.from_pretrained(base_model, path)``), or with
    ``merge=True`` as a plain model with the adapters merged into its weights.

    The directory loads with ``AutoModelForCausalLM.from_pretrained`` and vLLM: the KV cache is switched
    back on in the saved config (training turns it off), the architecture name is the unwrapped class's
    (``fully_shard`` renames it to ``FSDP<Name>``), and tied weights gathered as separate tensors are
    dropped so the loader re-ties them.

    Under FSDP2 every rank must call this (the full weights are gathered collectively); only the rank
    with ``write=True`` (rank 0) touches the file system. Call :func:`check_export_target` on every rank
    first, or let rank 0 raise here.

    Args:
        policy: A transformers ``PreTrainedModel`` (possibly FSDP2-sharded).
        tokenizer: Its tokenizer (anything with ``save_pretrained``).
        path: Output directory; see :func:`check_export_target` for what may be replaced.
        overwrite: Replace a non-empty directory that is not a previous export (its files are deleted).
        write: False on ranks other than 0: gather, but write nothing.
        setting: Name of the setting holding ``path``, for messages.
        merge: LoRA policy only: merge the adapters and write a plain model instead of the adapter directory.
    """
    # deferred: lit_entropy.checkpointing imports Lightning (seconds); lit_entropy.models imports without it
    from lit_entropy.checkpointing.atomic_io import atomic_directory_replace

    target = check_export_target(path, overwrite=overwrite, setting=setting) if write else Path(path)
    state = _export_state(policy, merge)  # collective under FSDP2
    if not write:
        return target

    def build(tmp: Path) -> None:
        if has_lora(policy) and not merge:
            save_adapter(policy, state, tmp, policy.name_or_path)
            tokenizer.save_pretrained(tmp)
        else:
            _save_model(policy, tokenizer, state, tmp)
        _write_marker(tmp)

    return atomic_directory_replace(build, target)


def _export_state(policy: Any, merge: bool) -> dict[str, torch.Tensor]:
    """The full state dict to write (rank 0; collective under FSDP2): a LoRA policy's adapters merged with ``merge``,
    tied copies dropped."""
    # deferred: lit_entropy.distributed imports Lightning (seconds); lit_entropy.models imports without it
    from lit_entropy.distributed.fsdp2 import full_state_dict

    state = full_state_dict(policy)
    if merge and has_lora(policy):
        state = dict(merged_weights(state.items(), lora_scalings(policy)))
    tied = getattr(policy, "all_tied_weights_keys", None)  # {target: source}, set by PreTrainedModel.post_init
    if isinstance(tied, dict) and getattr(policy.config, "tie_word_embeddings", False):
        # gathered shards are separate tensors: drop the tied copies the loader re-ties
        for key, source in tied.items():
            if key in state and source in state and torch.equal(state[key], state[source]):
                del state[key]
    return state


def _save_model(policy: Any, tokenizer: Any, state: dict[str, torch.Tensor], tmp: Path) -> None:
    """``save_pretrained`` of ``state`` with the KV cache on and the unwrapped architecture name, and the tokenizer."""
    # deferred: lit_entropy.distributed imports Lightning (seconds); lit_entropy.models imports without it
    from lit_entropy.distributed.fsdp2 import unwrapped_class

    config = policy.config
    use_cache, config.use_cache = config.use_cache, True  # training turns the KV cache off
    try:
        policy.save_pretrained(tmp, state_dict=state)
    finally:
        config.use_cache = use_cache
    tokenizer.save_pretrained(tmp)
    config_file = tmp / "config.json"
    saved = json.loads(config_file.read_text())
    saved["architectures"] = [unwrapped_class(policy).__name__]
    config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")


def _write_marker(tmp: Path) -> None:
    marker = {"library": "lit_entropy", "version": __version__}
    (tmp / EXPORT_MARKER).write_text(json.dumps(marker) + "\n")


def default_export_dir(trainer: Any) -> str:
    """Where a run exports its policy when ``model.logging.export_dir`` is null: ``<log_dir>/hf_model``."""
    return f"{trainer.log_dir or trainer.default_root_dir}/hf_model"


def export_policy(
    policy: Any,
    tokenizer: Any,
    path: str | os.PathLike,
    *,
    strategy: Any | None = None,
    write: bool = True,
    setting: str = "model.logging.export_dir",
    merge: bool = False,
) -> str:
    """Export ``policy`` and ``tokenizer`` to ``path`` (:func:`export_hf_model`) from a run; returns the path.

    Under a distributed ``strategy`` every rank calls it: rank 0's ``path`` is used, the full weights are
    gathered, the rank with ``write=True`` (rank 0) writes and all ranks wait for it.

    Args:
        policy: A transformers ``PreTrainedModel`` (possibly FSDP2-sharded).
        tokenizer: Its tokenizer.
        path: Output directory.
        strategy: The run's Lightning strategy (``broadcast`` / ``barrier``), or None outside a run.
        write: False on ranks other than 0.
        setting: Name of the setting holding ``path``, for messages.
        merge: LoRA policy only: write a merged plain model instead of the adapter directory.
    """
    # deferred: Lightning takes seconds to import, and lit_entropy.models imports without it
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    if strategy is not None:
        path = strategy.broadcast(str(path))
    export_hf_model(policy, tokenizer, path, write=write, setting=setting, merge=merge)
    if strategy is not None:
        strategy.barrier("export_pretrained")
    rank_zero_info(f"lit_entropy: exported the policy to {path}")
    return str(path)


def exports_at_train_end(logging: Any, trainer: Any) -> bool:
    """Whether a run with ``model.logging.export_on_train_end`` can export: it has ``model.logging.export_dir`` or a
    logger (whose directory holds ``hf_model``); without either it warns, as the default would be the working
    directory."""
    # deferred: Lightning takes seconds to import, and lit_entropy.models imports without it
    from lightning.pytorch.utilities.rank_zero import rank_zero_warn

    if logging.export_dir is not None or trainer.loggers:
        return True
    rank_zero_warn("lit_entropy: no logger and model.logging.export_dir is null: the policy is not exported")
    return False


def export_module(module: Any, path: str | os.PathLike | None) -> str:
    """Export an :class:`~lit_entropy.module.RFTModule`'s policy and tokenizer; returns the path.

    ``path`` None: ``<log_dir>/hf_model`` of its trainer (:func:`export_policy`). Under FSDP2 every rank calls it.
    """
    # deferred: internals.lightning imports Lightning (seconds); lit_entropy.models imports without it
    from lit_entropy.internals.lightning import attached_trainer

    trainer = attached_trainer(module)
    if path is None and trainer is None:
        raise ValueError("export_pretrained needs a path when the module is not attached to a Trainer")
    tokenizer = module.tokenizer or load_tokenizer(module.model_name_or_path)
    strategy = None if trainer is None else trainer.strategy
    path = path or default_export_dir(trainer)
    return export_policy(module.policy, tokenizer, path, strategy=strategy, write=module.global_rank == 0)

"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the models of an RFT module.

Used from ``RFTModule.configure_model`` under Lightning's ``ModelParallelStrategy``, which sets the
module's ``device_mesh``. Each model (policy, frozen reference, separate critic) is sharded on its own:
first every decoder layer, then the whole model, so each model's embeddings / norm / head form a separate
unit and frozen and trainable parameters never share one. The PPO value head is sharded as one more unit
(gradient clipping needs every trainable parameter to be a DTensor on the same mesh).
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any, cast

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.constants import default_pg_timeout
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

from lit_entropy.checkpointing.atomic_io import remove_stale_temporaries, swap_directory_in, temporary_name
from lit_entropy.internals.lightning import set_data_parallel_size
from lit_entropy.internals.transformers import decoder_layer_class_names, mark_fsdp_managed

__all__ = [
    "FSDP2Strategy",
    "decoder_layers",
    "full_state_dict",
    "module_param_dtype",
    "shard_models",
    "unwrapped_class",
]

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class FSDP2Strategy(ModelParallelStrategy):
    """``ModelParallelStrategy`` with every process data parallel: FSDP2 over all ranks, no tensor parallelism.

    The parent's ``"auto"`` sizes put the processes of a node into *tensor* parallelism, which
    lit_entropy does not use; this strategy sets ``data_parallel_size`` to the world size and
    ``tensor_parallel_size`` to 1.

    Args:
        save_distributed_checkpoint: False (default) gathers one consolidated checkpoint file on rank 0
            (written atomically, loadable without FSDP); True writes a sharded directory per checkpoint
            (faster and lighter for large models, loadable only under this strategy).
        process_group_backend: ``"nccl"`` / ``"gloo"``; None picks by accelerator.
        timeout: collective timeout.
    """

    def __init__(
        self,
        save_distributed_checkpoint: bool = False,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
    ) -> None:
        super().__init__(
            data_parallel_size="auto",
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.save_distributed_checkpoint = save_distributed_checkpoint

    def setup_environment(self) -> None:
        set_data_parallel_size(self, self.num_nodes * self.num_processes)
        super().setup_environment()

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any | None = None) -> None:
        """Consolidated: the parent's path (an atomic file write). Sharded: every rank writes into a sibling
        temp directory, which rank 0 then swaps in, so a crash mid-write leaves the previous checkpoint whole."""
        if not self.save_distributed_checkpoint:
            return super().save_checkpoint(checkpoint, filepath, storage_options)

        path = Path(self.broadcast(filepath))
        tmp = path.parent / self.broadcast(temporary_name())  # the same name on every rank
        if self.global_rank == 0:
            path.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(path.parent)
        self.barrier("lit_entropy_checkpoint_tmp")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)  # a failed write leaves nothing behind
            raise
        self.barrier("lit_entropy_checkpoint_written")
        if self.global_rank == 0:
            swap_directory_in(tmp, path)
        self.barrier("lit_entropy_checkpoint_swapped")


def decoder_layers(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks of a Hugging Face model: modules of the classes it names as not to be split.

    Raises:
        ValueError: when the model names no such class or none is found.
    """
    names = decoder_layer_class_names(model)
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise ValueError(
            f"cannot find the decoder layers of {type(model).__name__} (its _no_split_modules={sorted(names)!r}); "
            "FSDP2 sharding needs them"
        )
    return layers


def _models(module: Any) -> Iterator[nn.Module]:
    for name in ("policy", "ref_model", "critic"):
        model = getattr(module, name, None)
        if model is not None:
            yield model


def module_param_dtype(fsdp_param_dtype: str | None, trainer: Any) -> str | None:
    """The all-gather dtype of an RFTModule's FSDP2 shards: ``model.policy.fsdp_param_dtype`` when set, else
    bfloat16 under the trainer's ``bf16-mixed`` precision, else None (no mixed precision)."""
    precision = str(trainer.precision) if trainer is not None else ""
    return fsdp_param_dtype or ("bfloat16" if precision == "bf16-mixed" else None)


def shard_models(module: Any, mesh: Any, param_dtype: str | None = None) -> None:
    """``fully_shard`` the policy, reference, critic (per layer, then whole) and value head of ``module``.

    Args:
        module: an object with ``policy`` and optional ``ref_model``, ``critic``, ``value_head`` attributes.
            The reference must already be frozen (``requires_grad_(False)``).
        mesh: ``ModelParallelStrategy``'s 2-D device mesh (``data_parallel`` x ``tensor_parallel``); the
            tensor-parallel dimension must have size 1 (the loss normalisation and the GRPO groups assume
            every rank holds different prompts).
        param_dtype: ``"bfloat16"``, ``"float16"``, ``"float32"`` or None: dtype of the all-gathered parameters
            in forward/backward (gradients are reduced in float32; the sharded master weights keep their
            dtype). None = no mixed precision.
    """
    # torch warns on every rank, at every forward, that a sharded layer "returned a view tensor" whose in-place
    # modification would skip the all-gather. Qwen2 (the models lit_entropy is tested with) and lit_entropy
    # only use their outputs out of place; tests/distributed/test_fsdp2.py checks two ranks' training against
    # one process. Nothing for a user to act on.
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module \(.*\) returned a view tensor")

    names = tuple(getattr(mesh, "mesh_dim_names", None) or ())
    if "tensor_parallel" in names and mesh["tensor_parallel"].size() != 1:
        raise ValueError(
            f"FSDP2 in lit_entropy is data parallel only, got tensor_parallel_size={mesh['tensor_parallel'].size()}; "
            "set ModelParallelStrategy(data_parallel_size=<number of processes>, tensor_parallel_size=1) (the "
            "strategy's 'auto' picks tensor parallelism within a node)"
        )
    if "data_parallel" in names:
        mesh = mesh["data_parallel"]
    if param_dtype is not None and param_dtype not in _DTYPES:
        raise ValueError(f"param_dtype must be one of {sorted(_DTYPES)} or None, got {param_dtype!r}")
    mp = (
        MixedPrecisionPolicy(param_dtype=_DTYPES[param_dtype], reduce_dtype=torch.float32)
        if param_dtype is not None
        else MixedPrecisionPolicy()
    )
    for model in _models(module):
        if isinstance(model, FSDPModule):
            continue  # configure_model is idempotent
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        mark_fsdp_managed(model)  # HF ``generate`` then keeps the ranks' all-gathers matched
    head = getattr(module, "value_head", None)
    if head is not None and not isinstance(head, FSDPModule):
        fully_shard(head, mesh=mesh, mp_policy=mp)


def unwrapped_class(model: nn.Module) -> type:
    """The model's own class (``fully_shard`` swaps in a dynamic ``FSDP<Name>`` subclass)."""
    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """Full (unsharded) CPU state dict; collective under FSDP2: every rank must call it, rank 0 gets the tensors.

    Without FSDP2 it is the plain state dict on CPU.
    """
    if isinstance(model, FSDPModule):
        state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        # torch types the values as any state value (optimizer states too); a model's are its tensors.
        return cast(dict[str, torch.Tensor], state)
    return {k: v.detach().cpu() for k, v in model.state_dict().items()}

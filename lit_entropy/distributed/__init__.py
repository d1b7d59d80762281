"""Data parallelism: collectives that degrade to no-ops in one process (:mod:`.collectives`) and FSDP2 sharding of
the module's models (:mod:`.fsdp2`, :class:`FSDP2Strategy`)."""

from lit_entropy.distributed.collectives import (
    all_gather_counts,
    all_gather_equal,
    all_reduce_max,
    all_reduce_sum,
    global_top_k_cut,
    is_distributed,
    world_size,
)
from lit_entropy.distributed.fsdp2 import FSDP2Strategy, decoder_layers, full_state_dict, shard_models, unwrapped_class

__all__ = [
    "FSDP2Strategy",
    "all_gather_counts",
    "all_gather_equal",
    "all_reduce_max",
    "all_reduce_sum",
    "decoder_layers",
    "full_state_dict",
    "global_top_k_cut",
    "is_distributed",
    "shard_models",
    "unwrapped_class",
    "world_size",
]

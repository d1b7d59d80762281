"""The policy's settings (``model.policy``, with its LoRA group ``model.policy.lora``); re-exported by
:mod:`lit_entropy.settings`, which holds the other groups."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from lit_entropy.functional.checks import check_choice, check_number

__all__ = ["DTYPES", "LoraConfig", "PolicyConfig"]

DTYPES = ("auto", "float32", "bfloat16", "float16")


@dataclass(frozen=True)
class LoraConfig:
    """LoRA adapters on the policy (``pip install lit-entropy[lora]``): only they train; the KL term's reference is the
    policy with its adapters switched off (no second model is loaded)."""

    r: int = 16
    """Adapter rank."""
    alpha: float = 32.0
    """Scaling numerator: a layer computes ``W x + alpha / r * B A x``."""
    dropout: float = 0.0
    """Dropout on the adapters' input, in [0, 1)."""
    target_modules: list[str] | None = None
    """Names (suffixes) of the linear layers that get adapters; null = every linear layer of the decoder blocks
    (the attention and MLP projections; not the LM head, so the blockwise vocabulary pass applies)."""

    def __post_init__(self) -> None:
        check_number("model.policy.lora.r", self.r, low=1, integer=True)
        check_number("model.policy.lora.alpha", self.alpha, low=0, low_open=True)
        check_number("model.policy.lora.dropout", self.dropout, low=0, high=1, high_open=True)
        targets = self.target_modules
        if targets is not None and (not targets or not all(isinstance(t, str) and t for t in targets)):
            raise ValueError(
                f"model.policy.lora.target_modules must be a non-empty list of module names or null, got {targets!r}"
            )


@dataclass(frozen=True)
class PolicyConfig:
    """The policy model and how its forward pass runs."""

    model_name_or_path: str | None = None
    """Local dir or hub id of the policy, a packaged name (``smollm2-135m-instruct``), or null = the embedded one."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32"
    """dtype the weights are loaded in (``auto`` = the checkpoint's)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass."""
    fsdp_param_dtype: Literal["bfloat16", "float16", "float32"] | None = None
    """FSDP2 only: dtype of the all-gathered parameters; null = follow the trainer precision."""
    logprob_chunk_size: int | None = None
    """Rows per chunk of the full-logits vocabulary pass; null = automatic."""
    blockwise_lm_head: bool = True
    """Compute log-probs, entropy and E_p[S] from the final hidden states and the LM head block by block, never
    materialising ``[tokens, vocab]`` logits (forward and backward; a separate update forward forms the loss
    gradient inside the pass); a model whose head is not a plain linear layer uses full logits automatically."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of all weights (``model.policy.lora.*``); null = full fine-tuning."""

    def __post_init__(self) -> None:
        if isinstance(self.lora, Mapping):  # checkpoints store the group as a dict
            object.__setattr__(self, "lora", LoraConfig(**self.lora))
        check_choice("model.policy.dtype", self.dtype, DTYPES)
        if self.fsdp_param_dtype is not None:
            check_choice("model.policy.fsdp_param_dtype", self.fsdp_param_dtype, DTYPES[1:])
        check_number("model.policy.logprob_chunk_size", self.logprob_chunk_size, low=1, integer=True, optional=True)

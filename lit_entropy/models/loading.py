"""Loading the policy, reference and critic models and their tokenizer from local directories."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lit_entropy.models.hidden_states import lm_head_params
from lit_entropy.models.lora import apply_lora, has_lora, trainable_count
from lit_entropy.models.packaged import resolve_model_path
from lit_entropy.models.paths import check_model_dir

if TYPE_CHECKING:  # transformers takes ~2 s to import; only the annotations need it here
    from transformers import PreTrainedModel

__all__ = ["RFTModels", "check_context_length", "eos_token_ids", "load_causal_lm", "load_rft_models", "load_tokenizer"]


def load_causal_lm(path: str, dtype: str, setting: str) -> PreTrainedModel:
    """``AutoModelForCausalLM.from_pretrained(path)`` in ``dtype`` (``"auto"`` = the checkpoint's).

    Args:
        path: model directory (or hub id).
        dtype: ``auto``, ``float32``, ``bfloat16`` or ``float16``.
        setting: the setting that named ``path``, for error messages.
    """
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers import AutoModelForCausalLM

    path = check_model_dir(resolve_model_path(path, setting), setting)
    if dtype == "float16" and not torch.cuda.is_available():
        raise ValueError(
            f"model.policy.dtype='float16' cannot run on this CPU-only machine (half-precision matmuls are not "
            f"supported for training here); use float32 or bfloat16 (loading {setting}={path!r})"
        )
    return AutoModelForCausalLM.from_pretrained(path, dtype="auto" if dtype == "auto" else getattr(torch, dtype))


def load_tokenizer(path: str) -> Any:
    """The model's tokenizer, left-padding (generation appends to the right)."""
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(check_model_dir(path, require_weights=False))
    tokenizer.padding_side = "left"
    return tokenizer


def eos_token_ids(path: str, tokenizer: Any) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS plus the ``eos_token_id`` list of the checkpoint's
    ``generation_config.json`` (Qwen2.5-Instruct lists ``<|im_end|>`` and ``<|endoftext|>``; vLLM stops on both).

    Both engines stop on this set and the trainer reads it (truncation, ``model.loss.mask_truncated``), so a row that
    ends on any of them counts as finished whichever engine sampled it.
    """
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers import GenerationConfig

    ids: list[int] = []
    for source in (tokenizer.eos_token_id, _generation_config_eos(path, GenerationConfig)):
        for token in [source] if isinstance(source, int) else list(source or []):
            if token not in ids:
                ids.append(int(token))
    return tuple(ids)


def _generation_config_eos(path: str, generation_config: Any) -> Any:
    try:
        return generation_config.from_pretrained(path).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS only
        return None


def check_context_length(path: str, longest_prompt: int | None, max_new_tokens: int) -> None:
    """Refuse prompts plus completions longer than the model's ``max_position_embeddings``, before training."""
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers import AutoConfig

    context = getattr(AutoConfig.from_pretrained(path), "max_position_embeddings", None)
    if context is not None and longest_prompt is not None and longest_prompt + max_new_tokens > context:
        raise ValueError(
            f"prompts of up to {longest_prompt} tokens plus max_new_tokens={max_new_tokens} exceed the model's context "
            f"max_position_embeddings={context} ({path}); shorten the prompts (data.max_prompt_length) or lower "
            "model.sampling.max_new_tokens / model.evaluation.max_new_tokens"
        )


@dataclass
class RFTModels:
    """The models of one RFT run.

    Attributes:
        policy: the trained causal LM (train mode, KV cache off).
        ref_model: frozen reference for the KL term, or None.
        critic: separate critic backbone (PPO), or None.
        value_head: ``Linear(hidden, 1)`` on the critic or the policy (PPO), zero-initialised, or None.
    """

    policy: PreTrainedModel
    ref_model: PreTrainedModel | None = None
    critic: PreTrainedModel | None = None
    value_head: nn.Linear | None = None


def load_rft_models(settings: Any, model_name_or_path: str) -> RFTModels:
    """Load what ``settings`` (an :class:`~lit_entropy.settings.RFTSettings`) needs from local directories."""
    dtype, ppo = settings.policy.dtype, settings.ppo
    models = RFTModels(load_causal_lm(model_name_or_path, dtype, "model.policy.model_name_or_path").train())
    models.policy.config.use_cache = False
    lora = settings.policy.lora
    if lora is not None:
        _add_adapters(models.policy, lora, settings.loss.kl_coef > 0)
    _report_vocabulary_path(models.policy, settings.policy.blockwise_lm_head)
    if settings.policy.gradient_checkpointing:
        models.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora is not None:
            # With frozen embeddings the checkpointed blocks' inputs would not require grad, and a reentrant
            # checkpoint then drops the adapters' gradients: make the embedding output require grad (transformers
            # 5 does so itself for token-input models; a model that does not must not silently stop training).
            models.policy.enable_input_require_grads()
    if settings.loss.kl_coef > 0 and lora is None:  # LoRA: the reference is the policy with adapters off
        reference = load_causal_lm(model_name_or_path, dtype, "model.policy.model_name_or_path")
        models.ref_model = reference.requires_grad_(False).eval()
    if ppo is not None:
        if ppo.critic_model_name_or_path is not None:
            models.critic = load_causal_lm(ppo.critic_model_name_or_path, dtype, "model.ppo.critic_model_name_or_path")
        backbone = models.critic if models.critic is not None else models.policy
        models.value_head = nn.Linear(backbone.config.hidden_size, 1, dtype=backbone.dtype)
        nn.init.zeros_(models.value_head.weight)
        nn.init.zeros_(models.value_head.bias)
    return models


def _add_adapters(policy: PreTrainedModel, lora: Any, kl: bool) -> None:
    """Inject ``lora`` (a :class:`~lit_entropy.settings.LoraConfig`) into ``policy``; one log line with the counts."""
    # deferred: Lightning takes seconds to import, and lit_entropy.models imports without it
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    apply_lora(policy, lora.r, lora.alpha, lora.dropout, lora.target_modules)
    trainable, total = trainable_count(policy)
    reference = "; KL reference: the policy with its adapters off" if kl else ""
    rank_zero_info(
        f"lit_entropy: LoRA r={lora.r} alpha={lora.alpha}: {trainable:,} of {total:,} parameters train{reference}"
    )


def _report_vocabulary_path(policy: PreTrainedModel, blockwise: bool) -> None:
    """One log line saying how log-probs and entropy are computed over the vocabulary."""
    # deferred: Lightning takes seconds to import, and lit_entropy.models imports without it
    from lightning.pytorch.utilities.rank_zero import rank_zero_info

    if blockwise and lm_head_params(policy) is not None:  # the step's blockwise path applies
        path = (
            "blockwise (hidden states x LM head in blocks, no [tokens, vocab] logits; "
            "separate update forwards form the gradient inside the pass)"
        )
    elif blockwise and has_lora(policy.get_output_embeddings()):
        path = "full logits ([tokens, vocab] logits materialised): the LM head is a LoRA target"
    elif blockwise:
        path = "full logits ([tokens, vocab] logits materialised): the LM head is not a plain linear layer"
    else:
        path = "full logits ([tokens, vocab] logits materialised): model.policy.blockwise_lm_head is false"
    rank_zero_info(f"lit_entropy: vocabulary pass: {path}")

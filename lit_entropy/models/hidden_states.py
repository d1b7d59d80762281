"""Final hidden states of the response positions of a Hugging Face causal LM, without its logits.

The blockwise vocabulary pass (:func:`lit_entropy.functional.linear_entropy_stats`) needs the hidden states
that the LM head would read and the head's ``(weight, bias)``. :func:`response_hidden_states` runs the
model with the same position ids as the RL step's full forward but keeps no logits, so
``hidden @ weight.T + bias`` equals the model's own logits at the positions that predict the response
tokens. :func:`lm_head_params` returns ``None`` whenever the logits are *not* such a plain linear map
of the hidden states (a wrapped head, or logit scaling / soft-capping in the config), so callers can fall
back to full logits.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import Tensor, nn

__all__ = [
    "CausalLMOutput",
    "final_hidden_states",
    "forward_with_positions",
    "lm_head_params",
    "logits_head",
    "response_hidden_states",
]

# Config attributes that make logits != lm_head(hidden), with the value that means "off".
_LOGIT_TRANSFORMS = {
    "final_logit_softcapping": None,  # Gemma 2/3: tanh soft-capping
    "logit_scale": 1.0,  # Cohere: logits * logit_scale
    "logits_scaling": 1.0,  # Granite: logits / logits_scaling
    "output_multiplier_scale": 1.0,
}


class CausalLMOutput(Protocol):
    """What the library reads of a Hugging Face causal LM's output (``CausalLMOutputWithPast``)."""

    @property
    def logits(self) -> Tensor:
        """``[n, K, V]`` at the ``logits_to_keep`` positions."""

    @property
    def hidden_states(self) -> tuple[Tensor, ...] | None:
        """Every layer's hidden states ``[n, L, H]`` (the last after the final norm) with ``output_hidden_states``,
        else None."""


def forward_with_positions(
    model: nn.Module, sequences: Tensor, attention_mask: Tensor, *, logits_to_keep: Tensor, hidden: bool
) -> CausalLMOutput:
    """The model's forward on left-padded rows with position ids that skip the padding (as generation used).

    Args:
        model: a Hugging Face causal LM.
        sequences: ``[n, L]`` token ids.
        attention_mask: ``[n, L]``, 0 on left padding.
        logits_to_keep: index tensor of the positions whose logits are computed (empty: none).
        hidden: also return every layer's hidden states.
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    return model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=logits_to_keep,
        output_hidden_states=hidden,
        use_cache=False,
    )


def response_hidden_states(model: nn.Module, sequences: Tensor, attention_mask: Tensor, response_len: int) -> Tensor:
    """Last-layer hidden states ``[n, T, H]`` (after the final norm) at the positions predicting the response.

    The model's own forward runs (so wrappers such as FSDP2 see an ordinary call: its root parameters,
    the LM head included, are gathered and stay gathered until backward) with an *empty* ``logits_to_keep``
    index, so the LM head is applied to no position and no logits are computed.

    Args:
        model: a Hugging Face causal LM (``*ForCausalLM``) whose forward accepts ``logits_to_keep``.
        sequences: ``[n, L]`` token ids, prompt (left-padded) followed by the ``T`` response tokens.
        attention_mask: ``[n, L]``, 1 for real tokens.
        response_len: ``T``, the number of response tokens at the end of each row (``1 <= T < L``).

    Returns:
        ``[n, T, H]`` view: position ``L - T - 1 + t`` predicts response token ``t``. Position ids are
        ``cumsum(attention_mask) - 1`` clamped at 0, as in the full-model forward of the RL step.
    """
    length = sequences.shape[-1]
    if not 1 <= response_len < length:
        raise ValueError(
            f"response_len must lie in [1, {length - 1}] for sequences of length {length}, got {response_len}"
        )
    no_position = torch.empty(0, dtype=torch.long, device=sequences.device)
    out = forward_with_positions(model, sequences, attention_mask, logits_to_keep=no_position, hidden=True)
    # Only the last entry is kept; dropping ``out`` frees the other layers' outputs.
    return final_hidden_states(out, model)[:, length - response_len - 1 : length - 1]


def final_hidden_states(out: CausalLMOutput, model: nn.Module) -> Tensor:
    """The last layer's hidden states ``[n, L, H]`` of ``model``'s output ``out`` (run with
    ``output_hidden_states=True``); a ValueError naming the model when it returned none."""
    hidden_states = getattr(out, "hidden_states", None)
    if not hidden_states:
        raise ValueError(f"{type(model).__name__} returned no hidden_states with output_hidden_states=True")
    return hidden_states[-1]


def logits_head(model: nn.Module) -> nn.Module | None:
    """The module that maps final hidden states ``[..., H]`` to the logits (``model.get_output_embeddings()``, a
    plain ``nn.Linear`` or a wrapped one such as a LoRA-adapted head), or ``None`` when it is missing or the config
    transforms the logits after it (soft-capping, logit scaling): then only the model's own forward gives them."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    if not isinstance(head, nn.Module):
        return None
    config = getattr(model, "config", None)
    for name, off in _LOGIT_TRANSFORMS.items():
        value = getattr(config, name, off)
        if value is not None and value != off:
            return None
    return head


def lm_head_params(model: nn.Module) -> tuple[Tensor, Tensor | None] | None:
    """``(weight [V, H], bias [V] | None)`` of a plain linear LM head; ``None`` when the blockwise path does not apply.

    ``None`` when :func:`logits_head` is ``None`` or is not an ``nn.Linear`` (e.g. a PEFT-wrapped head).
    """
    head = logits_head(model)
    return (head.weight, head.bias) if isinstance(head, nn.Linear) else None

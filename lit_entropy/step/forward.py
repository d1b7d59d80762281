"""Forward passes over the response tokens of a rollout batch (Lightning-free).

A rollout row is ``prompt (left-padded to P) + response (T tokens)``; the logits at positions
``P - 1 .. P + T - 2`` predict the ``T`` response tokens. Only those positions go through the LM head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_entropy.functional.entropy import EntropyStats, entropy_stats
from lit_entropy.rollout.base import RolloutBatch

__all__ = ["ResponseForward", "response_forward", "response_logits", "value_estimates"]


def response_logits(
    model: nn.Module, sequences: Tensor, attention_mask: Tensor, response_len: int, *, hidden: bool = False
) -> tuple[Tensor, Tensor | None]:
    """Logits ``[n, T, V]`` that predict the response tokens, and optionally last-layer hidden states ``[n, T, H]``.

    Args:
        model: a Hugging Face causal LM.
        sequences: ``[n, P + T]`` prompt + response ids.
        attention_mask: ``[n, P + T]``, 0 on left padding.
        response_len: ``T``.
        hidden: also return the hidden states at the same positions (for a value head).
    """
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    length = sequences.shape[1]
    # An index tensor (not a count) keeps the logits contiguous, so the vocabulary pass needs no strided views.
    keep = torch.arange(length - response_len - 1, length - 1, device=sequences.device)
    out = model(
        input_ids=sequences,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=keep,
        output_hidden_states=hidden,
        use_cache=False,
    )
    return out.logits, (out.hidden_states[-1][:, keep] if hidden else None)


@dataclass
class ResponseForward:
    """One forward pass over response tokens.

    Attributes:
        stats: per-token log-probs, entropy, discriminator (and policy average) ``[n, T]``, float32.
        hidden: last-layer hidden states ``[n, T, H]`` when asked for (value head), else None.
    """

    stats: EntropyStats
    hidden: Tensor | None = None


def response_forward(
    model: nn.Module,
    rollout: RolloutBatch,
    *,
    temperature: float,
    chunk_size: int | None = None,
    policy_average: bool = False,
    hidden: bool = False,
) -> ResponseForward:
    """Statistics of the sampled response tokens under ``model`` (differentiable when grad is enabled).

    Args:
        model: a Hugging Face causal LM.
        rollout: the rows (prompt + response ids, attention mask, response mask).
        temperature: the sampling temperature; log-probs are those of ``softmax(logits / temperature)``.
        chunk_size: rows per chunk of the vocabulary pass; None = automatic.
        policy_average: also compute ``E_p[S]`` (Clip_V).
        hidden: also return the hidden states (value head on the policy).
    """
    responses = rollout.responses
    logits, states = response_logits(
        model, rollout.sequences, rollout.attention_mask, responses.shape[1], hidden=hidden
    )
    stats = entropy_stats(
        logits, responses, temperature=temperature, chunk_size=chunk_size, policy_average=policy_average
    )
    return ResponseForward(stats=stats, hidden=states)


def value_estimates(
    value_head: nn.Module, rollout: RolloutBatch, policy_hidden: Tensor | None, critic: nn.Module | None = None
) -> Tensor:
    """Values ``[n, T]`` (float32) of the states before each response token: ``value_head`` on the policy's
    hidden states, or on a separate ``critic``'s (then ``policy_hidden`` is ignored)."""
    hidden = policy_hidden
    if critic is not None:
        length = rollout.response_mask.shape[1]
        hidden = response_logits(critic, rollout.sequences, rollout.attention_mask, length, hidden=True)[1]
    return value_head(hidden).squeeze(-1).float()

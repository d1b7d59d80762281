"""Forward passes over the response tokens of a rollout batch (Lightning-free).

A rollout row is ``prompt (left-padded to P) + response (T tokens)``; the logits at positions
``P - 1 .. P + T - 2`` predict the ``T`` response tokens. Only those positions go through the LM head.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_entropy.functional.entropy import EntropyStats, entropy_stats, linear_entropy_loss, linear_entropy_stats
from lit_entropy.models.hidden_states import (
    final_hidden_states,
    forward_with_positions,
    lm_head_params,
    response_hidden_states,
)
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.step.packing import check_packing_attention, pack_rows, packed_forward, packs_in_bins, unpack_rows

__all__ = [
    "ResponseForward",
    "blockwise_response_loss",
    "response_forward",
    "response_logits",
    "uses_blockwise_head",
    "value_estimates",
]


def uses_blockwise_head(model: nn.Module) -> bool:
    """Whether the model's logits are a plain linear map of its final hidden states (the blockwise path applies)."""
    return lm_head_params(model) is not None


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
    length = sequences.shape[1]
    # An index tensor (not a count) keeps the logits contiguous, so the vocabulary pass needs no strided views.
    keep = torch.arange(length - response_len - 1, length - 1, device=sequences.device)
    out = forward_with_positions(model, sequences, attention_mask, logits_to_keep=keep, hidden=hidden)
    return out.logits, (final_hidden_states(out, model)[:, keep] if hidden else None)


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
    blockwise: bool = True,
    packed: bool = False,
) -> ResponseForward:
    """Statistics of the sampled response tokens under ``model`` (differentiable when grad is enabled).

    Blockwise path (``blockwise`` and a plain linear LM head, see :func:`uses_blockwise_head`): the model's forward
    keeps no logits; :func:`~lit_entropy.functional.linear_entropy_stats` computes log-probs, entropy, S and E_p[S]
    from the final hidden states and the head's weight block by block, in the forward and the backward.
    Otherwise the response logits are materialised and reduced by the chunked
    :func:`~lit_entropy.functional.entropy_stats`.

    Args:
        model: a Hugging Face causal LM.
        rollout: the rows (prompt + response ids, attention mask, response mask).
        temperature: the sampling temperature; log-probs are those of ``softmax(logits / temperature)``.
        chunk_size: rows per chunk of the vocabulary pass; None = automatic.
        policy_average: also compute ``E_p[S]`` (Clip_V).
        hidden: also return the hidden states (value head on the policy).
        blockwise: use the blockwise path when the model allows it.
        packed: run the model on the rows packed into one (:mod:`lit_entropy.step.packing`), no padding.
    """
    responses = rollout.responses
    if packed:
        return _packed_response_forward(model, rollout, temperature, chunk_size, policy_average, hidden, blockwise)
    if blockwise and uses_blockwise_head(model):
        states = response_hidden_states(model, rollout.sequences, rollout.attention_mask, responses.shape[1])
        # Read the head after the forward: under FSDP2 its weight is gathered only from the root's forward on.
        weight, bias = _linear_head(model)
        # Only real response tokens go through the vocabulary pass (verl's "remove padding"): positions after
        # EOS are masked out of every loss and statistic, and skipping them saves their share of the head's
        # matmuls forward and backward. They read 0 in the returned [n, T] tensors.
        mask = rollout.response_mask
        flat = linear_entropy_stats(
            states[mask], weight, responses[mask], bias=bias, temperature=temperature, policy_average=policy_average
        )
        return ResponseForward(stats=_unpack_stats(flat, mask), hidden=states if hidden else None)
    logits, last_hidden = response_logits(
        model, rollout.sequences, rollout.attention_mask, responses.shape[1], hidden=hidden
    )
    stats = entropy_stats(
        logits, responses, temperature=temperature, chunk_size=chunk_size, policy_average=policy_average
    )
    return ResponseForward(stats=stats, hidden=last_hidden)


def _packed_response_forward(
    model: nn.Module,
    rollout: RolloutBatch,
    temperature: float,
    chunk_size: int | None,
    policy_average: bool,
    hidden: bool,
    blockwise: bool,
) -> ResponseForward:
    """:func:`response_forward` on the rows packed into one: the blockwise pass (or full logits at the predicting
    positions only) over the response-mask tokens, unpacked to ``[n, T]`` (zeros off the mask)."""
    check_packing_attention(model)
    head = blockwise and uses_blockwise_head(model)
    rows, mask = pack_rows(rollout, binned=head and packs_in_bins(model)), rollout.response_mask
    if head:
        states = packed_forward(model, rows)[1]
        weight, bias = _linear_head(model)  # after the forward (FSDP2 gathers the head there)
        flat = linear_entropy_stats(
            states, weight, rows.targets, bias=bias, temperature=temperature, policy_average=policy_average
        )
    else:
        logits, states = packed_forward(model, rows, logits=True)
        flat = entropy_stats(
            logits, rows.targets, temperature=temperature, chunk_size=chunk_size, policy_average=policy_average
        )
    return ResponseForward(stats=_unpack_stats(flat, mask), hidden=unpack_rows(states, mask) if hidden else None)


def blockwise_response_loss(
    model: nn.Module,
    rollout: RolloutBatch,
    loss_of: Callable[[Tensor, Tensor], Tensor],
    *,
    temperature: float,
    packed: bool = False,
) -> tuple[Tensor, ResponseForward]:
    """``loss_of(stats)`` of the sampled response tokens, its gradient formed inside the vocabulary pass.

    For a separate update forward the loss is known before the pass, so
    :func:`~lit_entropy.functional.linear_entropy_loss` multiplies each logits block's gradient into the
    hidden-state and LM-head gradients while the block is at hand: three head-sized matmuls instead of the four of
    :func:`response_forward` + backward (which must recompute the logits). Requires :func:`uses_blockwise_head`.

    Args:
        model: a Hugging Face causal LM with a plain linear head.
        rollout: the rows.
        loss_of: maps the per-token ``(logprobs, entropy)`` (each ``[n, T]``, 0 off the response mask; the pass
            forms no other statistic before the loss) to a scalar that is a sum of per-token terms (every loss of
            :func:`~lit_entropy.step.update_loss` is); it is called once per row chunk of the pass.
        temperature: the sampling temperature.
        packed: run the model on the rows packed into one (:mod:`lit_entropy.step.packing`).

    Returns:
        ``(loss, forward)``: the loss (differentiable w.r.t. the model) and the forward with detached statistics and
        the hidden states ``[n, T, H]`` (with graph, for a value head).
    """
    responses, mask = rollout.responses, rollout.response_mask
    if packed:
        check_packing_attention(model)
        rows = pack_rows(rollout, binned=packs_in_bins(model))
        flat_states, targets = packed_forward(model, rows)[1], rows.targets
        states = unpack_rows(flat_states, mask)
    else:
        states = response_hidden_states(model, rollout.sequences, rollout.attention_mask, responses.shape[1])
        flat_states, targets = states[mask], responses[mask]
    weight, bias = _linear_head(model)  # after the forward (FSDP2 gathers the head there)

    def token_loss(logprobs: Tensor, entropy: Tensor) -> Tensor:
        return loss_of(_unpack(logprobs, mask), _unpack(entropy, mask))

    loss, flat = linear_entropy_loss(flat_states, weight, targets, token_loss, bias=bias, temperature=temperature)
    return loss, ResponseForward(stats=_unpack_stats(flat, mask), hidden=states)


def _linear_head(model: nn.Module) -> tuple[Tensor, Tensor | None]:
    """:func:`~lit_entropy.models.hidden_states.lm_head_params` of a model the blockwise path was chosen for
    (:func:`uses_blockwise_head`); a ValueError naming the model if its head is not a plain linear layer."""
    params = lm_head_params(model)
    if params is None:
        raise ValueError(f"{type(model).__name__}'s LM head is not a plain linear layer: the blockwise pass needs one")
    return params


def _unpack(values: Tensor, mask: Tensor) -> Tensor:
    """``[M]`` values of the True positions of ``mask`` ``[n, T]`` -> ``[n, T]``, zeros elsewhere (differentiable)."""
    return values.new_zeros(mask.shape).masked_scatter(mask, values)


def _unpack_stats(flat: EntropyStats, mask: Tensor) -> EntropyStats:
    """Every statistic of ``flat`` (``[M]`` each, the True positions of ``mask``) unpacked to ``[n, T]``."""
    average = flat.policy_average
    return EntropyStats(
        _unpack(flat.logprobs, mask),
        _unpack(flat.entropy, mask),
        _unpack(flat.discriminator, mask),
        None if average is None else _unpack(average, mask),
    )


def value_estimates(
    value_head: nn.Module,
    rollout: RolloutBatch,
    policy_hidden: Tensor | None,
    critic: nn.Module | None = None,
    *,
    packed: bool = False,
) -> Tensor:
    """Values ``[n, T]`` (float32) of the states before each response token: ``value_head`` on the policy's
    hidden states, or on a separate ``critic``'s (then ``policy_hidden`` is ignored; ``packed``: the critic runs
    on the rows packed into one)."""
    hidden = policy_hidden
    if critic is not None and packed:
        check_packing_attention(critic)
        rows = pack_rows(rollout, binned=packs_in_bins(critic))
        hidden = unpack_rows(packed_forward(critic, rows)[1], rollout.response_mask)
    elif critic is not None:
        length = rollout.response_mask.shape[1]
        hidden = response_logits(critic, rollout.sequences, rollout.attention_mask, length, hidden=True)[1]
    return value_head(hidden).squeeze(-1).float()

"""The trainer's probability mass in the set top-k / top-p keep, for comparing its log-probs with an engine's."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypedDict

import torch
from torch import Tensor, nn

from lit_entropy.functional.entropy import default_chunk_rows
from lit_entropy.functional.entropy.blocks import block_logits
from lit_entropy.functional.rollout_correction import kept_log_mass
from lit_entropy.models.hidden_states import lm_head_params, logits_head, response_hidden_states
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import RFTSettings
from lit_entropy.step.forward import response_logits
from lit_entropy.step.packing import check_packing_attention, pack_rows, packed_forward, packs_in_bins

__all__ = ["kept_set_log_mass"]

#: ``(first token, last token + 1, out [r, V])`` -> the logits of those response tokens (written into ``out``, or a
#: tensor of their own).
LogitsChunk = Callable[[int, int, Tensor], Tensor]


class KeptSetFilters(TypedDict):
    """``model.sampling``'s top-k / top-p: the keywords of
    :func:`~lit_entropy.functional.rollout_correction.kept_log_mass`."""

    top_k: int
    top_p: float


@torch.no_grad()
def kept_set_log_mass(model: nn.Module, rollout: RolloutBatch, settings: RFTSettings) -> Tensor | None:
    """``log`` of the mass ``softmax(logits / T)`` puts on the tokens ``model.sampling``'s top-k / top-p keep, at
    each response position ``[n, T]`` (float32, 0 outside the response mask); None unless
    ``model.loss.rollout_correction.kept_set_logprobs`` is on, a filter is on and the engine reported log-probs.

    One more forward of ``model`` over the rows (no graph; packed under ``model.update.pack_sequences``, as the
    statistics pass). As in :func:`~lit_entropy.step.response_forward` the forward keeps no logits: the head runs on
    the final hidden states of the response tokens only, ``model.policy.logprob_chunk_size`` tokens at a time
    (None: :func:`~lit_entropy.functional.entropy.logits.default_chunk_rows`): a plain linear head (with
    ``model.policy.blockwise_lm_head``) into one reused buffer, any other head module (a LoRA-wrapped head) called
    on each chunk. Only when the config transforms the logits after the head (soft-capping, logit scaling: each
    architecture's forward applies them its own way) does the model's forward compute the response logits, which
    are then reduced in the same chunks.
    """
    sampling = settings.sampling
    filtered = sampling.top_k > 0 or sampling.top_p < 1.0
    if not (settings.loss.rollout_correction.kept_set_logprobs and filtered and rollout.rollout_logprobs is not None):
        return None
    mask = rollout.response_mask
    tokens = mask.reshape(-1).nonzero().squeeze(1)  # flat [n * T] index of each response token
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    if not tokens.numel():
        return out
    logits_of, vocab, dtype = _logits_chunks(model, rollout, settings, tokens)
    rows = settings.policy.logprob_chunk_size or default_chunk_rows(vocab, device=mask.device)
    filters = KeptSetFilters(top_k=sampling.top_k, top_p=sampling.top_p)
    _reduce_chunks(logits_of, tokens, out.view(-1), (rows, vocab, dtype), sampling.temperature, filters)
    return out


def _logits_chunks(
    model: nn.Module, rollout: RolloutBatch, settings: RFTSettings, tokens: Tensor
) -> tuple[LogitsChunk, int, torch.dtype]:
    """``(logits of response tokens start:stop, V, logits dtype)`` for :func:`kept_set_log_mass` (one forward;
    ``tokens``: the flat ``[n * T]`` index of each response token)."""
    packed, width = settings.update.pack_sequences, rollout.response_mask.shape[1]
    if packed:
        check_packing_attention(model)
    head = logits_head(model)
    if head is None:  # the config transforms the logits: the model's own, at the response positions only
        if packed:
            logits = packed_forward(model, pack_rows(rollout), logits=True)[0]  # [M, V], response-token order
            return (lambda start, stop, out: logits[start:stop]), logits.shape[-1], logits.dtype
        flat = response_logits(model, rollout.sequences, rollout.attention_mask, width)[0].flatten(0, 1)

        def padded_logits(start: int, stop: int, out: Tensor) -> Tensor:
            return torch.index_select(flat, 0, tokens[start:stop], out=out)

        return padded_logits, flat.shape[-1], flat.dtype
    if packed:
        states = packed_forward(model, pack_rows(rollout, binned=packs_in_bins(model)))[1]  # [M, H]
    else:
        states = response_hidden_states(model, rollout.sequences, rollout.attention_mask, width)
        states = states[rollout.response_mask]
    params = lm_head_params(model)  # after the forward (FSDP2 gathers the head there)
    if settings.policy.blockwise_lm_head and params is not None:
        weight, bias = params

        def head_logits(start: int, stop: int, out: Tensor) -> Tensor:
            return block_logits(states[start:stop], weight, bias, out)

        return head_logits, weight.shape[0], weight.dtype
    probe = head(states[:1])  # any other head module: called on each chunk, a [chunk, V] tensor each time
    return (lambda start, stop, out: head(states[start:stop])), probe.shape[-1], probe.dtype


def _reduce_chunks(
    logits_of: LogitsChunk,
    tokens: Tensor,
    out: Tensor,
    buffer: tuple[int, int, torch.dtype],
    temperature: float,
    filters: KeptSetFilters,
) -> None:
    """``out[tokens] = kept_log_mass(logits / temperature, **filters)``, ``rows`` tokens at a time through two
    reused ``[rows, V]`` buffers (``buffer = (rows, V, dtype)``: the logits in the model's dtype, their float32
    temperature-scaled copy)."""
    rows, vocab, dtype = buffer
    count = tokens.numel()  # > 0: kept_set_log_mass returns before a forward without response tokens
    rows = min(rows, count)
    raw = torch.empty(rows, vocab, dtype=dtype, device=out.device)
    scaled = raw if dtype == torch.float32 else torch.empty(rows, vocab, dtype=torch.float32, device=out.device)
    for start in range(0, count, rows):
        stop = min(start + rows, count)
        logits = logits_of(start, stop, raw[: stop - start])
        scores = scaled[: stop - start]
        if scores.data_ptr() != logits.data_ptr():
            scores.copy_(logits)  # float32 before the division, as ``logits.float() / T``
        scores.div_(temperature)
        out[tokens[start:stop]] = kept_log_mass(scores, **filters)

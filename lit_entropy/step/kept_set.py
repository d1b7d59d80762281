"""The trainer's probability mass in the set top-k / top-p keep, for comparing its log-probs with an engine's."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor, nn

from lit_entropy.functional.entropy import default_chunk_rows
from lit_entropy.functional.rollout_correction import kept_log_mass
from lit_entropy.models.hidden_states import lm_head_params, response_hidden_states
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import RFTSettings
from lit_entropy.step.forward import response_logits, uses_blockwise_head

__all__ = ["kept_set_log_mass"]

#: ``(first token, last token + 1, out [r, V])`` -> the logits of those response tokens written into ``out``.
LogitsChunk = Callable[[int, int, Tensor], Tensor]


@torch.no_grad()
def kept_set_log_mass(model: nn.Module, rollout: RolloutBatch, settings: RFTSettings) -> Tensor | None:
    """``log`` of the mass ``softmax(logits / T)`` puts on the tokens ``model.sampling``'s top-k / top-p keep, at
    each response position ``[n, T]`` (float32, 0 outside the response mask); None unless
    ``model.rollout_correction.kept_set_logprobs`` is on, a filter is on and the engine reported log-probs.

    One more forward of ``model`` over the rows (no graph). As in :func:`~lit_entropy.step.response_forward`, a
    plain linear LM head (and ``model.policy.blockwise_lm_head``) keeps the forward's logits out: the head runs
    on the final hidden states of the response tokens only, ``model.policy.logprob_chunk_size`` tokens at a time
    (None: :func:`~lit_entropy.functional.entropy.default_chunk_rows`), into one reused buffer. Otherwise (a
    wrapped head, logit scaling or soft-capping) the model's own response logits are reduced in the same chunks.
    """
    sampling = settings.sampling
    filtered = sampling.top_k > 0 or sampling.top_p < 1.0
    if not (settings.rollout_correction.kept_set_logprobs and filtered and rollout.rollout_logprobs is not None):
        return None
    mask = rollout.response_mask
    tokens = mask.reshape(-1).nonzero().squeeze(1)  # flat [n * T] index of each response token
    if settings.policy.blockwise_lm_head and uses_blockwise_head(model):
        states = response_hidden_states(model, rollout.sequences, rollout.attention_mask, mask.shape[1])[mask]
        weight, bias = lm_head_params(model)  # after the forward (FSDP2 gathers the head there)
        vocab, dtype, logits_of = weight.shape[0], weight.dtype, _head_chunks(states, weight, bias)
    else:
        logits = response_logits(model, rollout.sequences, rollout.attention_mask, mask.shape[1])[0]
        vocab, dtype = logits.shape[-1], logits.dtype
        flat = logits.reshape(-1, vocab)

        def logits_of(start: int, stop: int, out: Tensor) -> Tensor:
            return torch.index_select(flat, 0, tokens[start:stop], out=out)

    rows = settings.policy.logprob_chunk_size or default_chunk_rows(vocab, device=mask.device)
    out = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
    filters = {"top_k": sampling.top_k, "top_p": sampling.top_p}
    _reduce_chunks(logits_of, tokens, out.view(-1), (rows, vocab, dtype), sampling.temperature, filters)
    return out


def _head_chunks(states: Tensor, weight: Tensor, bias: Tensor | None) -> LogitsChunk:
    """Logits of response tokens ``start:stop`` from their final hidden states ``states`` ``[M, H]``: the same
    ``addmm`` / ``mm`` as the model's ``nn.Linear`` head, written into the caller's buffer."""

    def logits_of(start: int, stop: int, out: Tensor) -> Tensor:
        if bias is None:
            return torch.mm(states[start:stop], weight.t(), out=out)
        return torch.addmm(bias, states[start:stop], weight.t(), out=out)

    return logits_of


def _reduce_chunks(
    logits_of: LogitsChunk,
    tokens: Tensor,
    out: Tensor,
    buffer: tuple[int, int, torch.dtype],
    temperature: float,
    filters: dict[str, float],
) -> None:
    """``out[tokens] = kept_log_mass(logits / temperature, **filters)``, ``rows`` tokens at a time through two
    reused ``[rows, V]`` buffers (``buffer = (rows, V, dtype)``: the logits in the model's dtype, their float32
    temperature-scaled copy)."""
    rows, vocab, dtype = buffer
    count = tokens.numel()
    if count == 0:
        return
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

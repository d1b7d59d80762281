"""Padding-free forwards: a micro-batch's rows concatenated into one row with restarting position ids.

With ``model.update.pack_sequences`` the real tokens of every row (prompt without its left padding, response up to
its mask) are laid end to end in a single row ``[1, L]``, ``L = sum of the rows' lengths``; position ids restart
at 0 for each row, and the model is called without an attention mask. transformers then separates the rows itself:
``flash_attention_2`` reads the sequence boundaries from the position ids, ``sdpa`` and ``eager`` build the
block-diagonal causal mask from them (transformers 5.x ``find_packed_sequence_indices``; pinned by
``tests/internals/test_transformers.py``). Every position then sees exactly the tokens it saw in its padded row at
the same position id, so log-probs, entropy, S, E_p[S] and gradients equal the padded path's (up to float
rounding), and no transformer work is spent on padding.

Only the hidden states at the positions that predict response tokens are kept, in the order of the True entries of
``response_mask`` (row-major): the order the blockwise vocabulary pass uses for the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from lit_entropy.internals.transformers import attention_implementation
from lit_entropy.rollout.base import RolloutBatch

__all__ = ["PACKING_ATTENTION", "PackedRows", "check_packing_attention", "pack_rows", "packed_forward", "unpack_rows"]

PACKING_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")
"""Attention implementations that keep packed rows apart (``flex_attention`` has no CPU backward in torch 2.13)."""


def check_packing_attention(*models: nn.Module | None, setting: str = "model.update.pack_sequences") -> None:
    """Raise a one-line ValueError naming ``setting`` when a model's attention implementation cannot keep packed
    rows apart (None entries are skipped)."""
    for model in models:
        impl = None if model is None else attention_implementation(model)
        if model is not None and impl not in PACKING_ATTENTION:
            raise ValueError(
                f"{setting}=true needs an attention implementation that keeps packed sequences apart, one of "
                f"{PACKING_ATTENTION}, but {type(model).__name__} uses {impl!r}: load it with one of them or set "
                f"{setting}=false"
            )


@dataclass(frozen=True)
class PackedRows:
    """One packed row.

    Attributes:
        input_ids: ``[1, L]`` the rows' real tokens end to end.
        position_ids: ``[1, L]`` restarting at 0 for every row.
        predict: ``[M]`` positions whose hidden state predicts a response token (``M`` = response-mask tokens).
        targets: ``[M]`` those response tokens.
    """

    input_ids: Tensor
    position_ids: Tensor
    predict: Tensor
    targets: Tensor


def pack_rows(rollout: RolloutBatch) -> PackedRows:
    """The real tokens of ``rollout``'s rows (``attention_mask`` 1) packed into one row, with the positions that
    predict each response-mask token (requires every row's real tokens to be contiguous, as rollouts have them)."""
    keep = rollout.attention_mask.bool()
    lengths = keep.sum(-1)
    prompt = keep[:, : rollout.prompt_length].sum(-1)
    starts = torch.cumsum(lengths, 0) - lengths
    input_ids = rollout.sequences[keep].unsqueeze(0)
    # position k of the packed row lies in row r at offset k - starts[r]
    row_of = torch.repeat_interleave(torch.arange(len(lengths), device=lengths.device), lengths)
    position_ids = (torch.arange(input_ids.shape[1], device=lengths.device) - starts[row_of]).unsqueeze(0)
    mask = rollout.response_mask
    rows, cols = mask.nonzero(as_tuple=True)  # row-major, as ``states[mask]``
    predict = starts[rows] + prompt[rows] - 1 + cols
    return PackedRows(input_ids, position_ids, predict, rollout.responses[mask])


def packed_forward(model: nn.Module, packed: PackedRows, *, logits: bool = False) -> tuple[Tensor | None, Tensor]:
    """The model on one packed row: logits ``[M, V]`` at the predicting positions (when ``logits``) and the
    last-layer hidden states ``[M, H]`` there (after the final norm)."""
    keep = packed.predict if logits else torch.empty(0, dtype=torch.long, device=packed.predict.device)
    out = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=None,  # transformers builds the block-diagonal mask from the restarting position ids
        logits_to_keep=keep,
        output_hidden_states=True,
        use_cache=False,
    )
    hidden = out.hidden_states[-1][0, packed.predict]
    return (out.logits[0] if logits else None), hidden


def unpack_rows(values: Tensor, mask: Tensor) -> Tensor:
    """``[M, ...]`` values of the True positions of ``mask`` ``[n, T]`` -> ``[n, T, ...]``, zeros elsewhere
    (differentiable)."""
    out = values.new_zeros(*mask.shape, *values.shape[1:])
    return out.index_put((mask.nonzero(as_tuple=True)), values)

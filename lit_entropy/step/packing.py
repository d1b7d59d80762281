"""Padding-free forwards: a micro-batch's rows concatenated into one row with restarting position ids.

With ``model.update.pack_sequences`` the real tokens of every row (prompt without its left padding, response up to
its mask) are laid end to end in a single row ``[1, L]``, ``L = sum of the rows' lengths``; position ids restart
at 0 for each row, and the model is called without an attention mask. transformers then separates the rows itself:
``flash_attention_2`` reads the sequence boundaries from the position ids, ``sdpa`` and ``eager`` build the
block-diagonal causal mask from them (transformers 5.x ``find_packed_sequence_indices``; pinned by
``tests/internals/test_transformers.py``). Every position then sees exactly the tokens it saw in its padded row at
the same position id, so log-probs, entropy, S, E_p[S] and gradients equal the padded path's (up to float
rounding), and no transformer work is spent on padding.

Bins (``binned``): ``sdpa`` and ``eager`` compute attention over every pair of positions of a row and mask the pairs
across sequences, so one packed row of ``L`` tokens costs ``L^2`` per layer: more than the padded batch's ``n x
width^2`` once the batch has a few rows. Then the rows go first-fit-decreasing into bins as wide as the longest row
(``[B, width]``, each bin a packed row, its unused tail a dummy sequence of pad tokens), which costs about ``L x
width``. Flash attention reads the sequence boundaries and skips the cross pairs, so it keeps one row.

Only the hidden states at the positions that predict response tokens are kept, in the order of the True entries of
``response_mask`` (row-major): the order the blockwise vocabulary pass uses for the padded path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, overload

import torch
from torch import Tensor, nn

from lit_entropy.internals.transformers import attention_implementation
from lit_entropy.rollout.base import RolloutBatch

__all__ = [
    "PACKING_ATTENTION",
    "PackedRows",
    "check_packing_attention",
    "first_fit_bins",
    "pack_rows",
    "packed_forward",
    "packs_in_bins",
    "unpack_rows",
]

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


def packs_in_bins(model: nn.Module) -> bool:
    """Whether packed rows should go into bins (:func:`first_fit_bins`) for ``model``: every attention but flash
    attention spends work on the masked pairs across the sequences of a row."""
    return not str(attention_implementation(model)).startswith("flash_attention")


@dataclass(frozen=True)
class PackedRows:
    """Packed rows: one ``[1, L]``, or ``B`` bins ``[B, width]``.

    Attributes:
        input_ids: ``[B, W]`` the rows' real tokens end to end (a bin's unused tail: pad id 0).
        position_ids: ``[B, W]`` restarting at 0 for every row (and for a bin's tail).
        predict: ``[M]`` positions in the flattened ``[B * W]`` layout whose hidden state predicts a response token
            (``M`` = response-mask tokens).
        targets: ``[M]`` those response tokens.
    """

    input_ids: Tensor
    position_ids: Tensor
    predict: Tensor
    targets: Tensor


def first_fit_bins(lengths: Tensor) -> tuple[Tensor, Tensor, int]:
    """First-fit decreasing: ``(bin [n], offset in its bin [n], width)`` for rows of ``lengths`` ``[n]`` (long, on
    the CPU or not) in bins of ``width`` = the longest row."""
    sizes = lengths.cpu().tolist()
    width = max(sizes)
    used: list[int] = []  # filled length of each bin
    bins, offsets = [0] * len(sizes), [0] * len(sizes)
    for row in sorted(range(len(sizes)), key=lambda r: -sizes[r]):  # stable: equal lengths keep row order
        b = next((b for b, u in enumerate(used) if u + sizes[row] <= width), len(used))
        if b == len(used):
            used.append(0)
        bins[row], offsets[row] = b, used[b]
        used[b] += sizes[row]
    as_tensor = lambda values: torch.tensor(values, dtype=torch.long, device=lengths.device)  # noqa: E731
    return as_tensor(bins), as_tensor(offsets), width


def pack_rows(rollout: RolloutBatch, *, binned: bool = False) -> PackedRows:
    """The real tokens of ``rollout``'s rows (``attention_mask`` 1) packed into one row (or into bins, see the module
    docstring), with the positions that predict each response-mask token (requires every row's real tokens to be
    contiguous, as rollouts have them)."""
    keep = rollout.attention_mask.bool()
    lengths = keep.sum(-1)
    prompt = keep[:, : rollout.prompt_length].sum(-1)
    device = lengths.device
    if binned:
        bins, offsets, width = first_fit_bins(lengths)
    else:
        bins, offsets, width = torch.zeros_like(lengths), torch.cumsum(lengths, 0) - lengths, int(lengths.sum())
    count = int(bins.max()) + 1
    starts = bins * width + offsets  # where each row starts in the flattened [count * width] layout
    # a bin's tail past its rows is one dummy sequence (positions from 0): it attends only to itself
    used = torch.zeros(count, dtype=torch.long, device=device).index_add_(0, bins, lengths)
    position_ids = torch.arange(width, device=device) - used.unsqueeze(1)
    input_ids = torch.zeros(count, width, dtype=rollout.sequences.dtype, device=device)
    row_of = torch.repeat_interleave(torch.arange(len(lengths), device=device), lengths)
    token = torch.arange(int(lengths.sum()), device=device) - (torch.cumsum(lengths, 0) - lengths)[row_of]
    flat = starts[row_of] + token
    input_ids.view(-1)[flat] = rollout.sequences[keep]
    position_ids.view(-1)[flat] = token
    mask = rollout.response_mask
    rows, cols = mask.nonzero(as_tuple=True)  # row-major, as ``states[mask]``
    predict = starts[rows] + prompt[rows] - 1 + cols
    return PackedRows(input_ids, position_ids, predict, rollout.responses[mask])


@overload
def packed_forward(model: nn.Module, packed: PackedRows, *, logits: Literal[True]) -> tuple[Tensor, Tensor]: ...
@overload
def packed_forward(model: nn.Module, packed: PackedRows, *, logits: Literal[False] = ...) -> tuple[None, Tensor]: ...
def packed_forward(model: nn.Module, packed: PackedRows, *, logits: bool = False) -> tuple[Tensor | None, Tensor]:
    """The model on packed rows: logits ``[M, V]`` at the predicting positions (when ``logits``; one row only) and
    the last-layer hidden states ``[M, H]`` there (after the final norm)."""
    if logits and packed.input_ids.shape[0] != 1:
        raise ValueError("packed_forward: logits need the rows packed into one row (pack_rows(binned=False))")
    keep = packed.predict if logits else torch.empty(0, dtype=torch.long, device=packed.predict.device)
    out = model(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=None,  # transformers builds the block-diagonal mask from the restarting position ids
        logits_to_keep=keep,
        output_hidden_states=True,
        use_cache=False,
    )
    hidden = out.hidden_states[-1].flatten(0, 1)[packed.predict]
    return (out.logits[0] if logits else None), hidden


def unpack_rows(values: Tensor, mask: Tensor) -> Tensor:
    """``[M, ...]`` values of the True positions of ``mask`` ``[n, T]`` -> ``[n, T, ...]``, zeros elsewhere
    (differentiable)."""
    out = values.new_zeros(*mask.shape, *values.shape[1:])
    return out.index_put((mask.nonzero(as_tuple=True)), values)

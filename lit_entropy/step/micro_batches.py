"""Token-budget micro-batches: rows grouped by length so each forward holds as many rows as fit (Lightning-free).

With ``model.update.max_tokens_per_micro_batch`` a mini-batch's rows are sorted by length and cut into
consecutive groups whose forward processes at most that many token positions (prompt + response): ``rows x
(longest prompt + longest response)`` of the group when rows are padded, the sum of the rows' real lengths when
they are packed (:mod:`lit_entropy.step.packing`). Each group is then trimmed to its own widths
(:func:`trim_rollout`), so the transformer no longer runs on the padding that the batch's longest row forces
on every other row. A row longer than the budget gets a micro-batch of its own.

Every rank must run the same number of forwards and backwards (the gradient all-reduce of DDP, FSDP2's
all-gathers and reduce-scatters): :func:`micro_batch_plan` agrees on the largest count over the ranks and splits
the largest groups of the ranks that need fewer. Loss normalisation does not depend on the split: the update
divides by the mini-batch's global count (:func:`~lit_entropy.step.global_loss_normalizer`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import overload

import torch
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_max
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import UpdateConfig
from lit_entropy.step.schedule import row_slices

__all__ = [
    "forward_parts",
    "forward_rows",
    "group_rows",
    "micro_batch_plan",
    "micro_batch_tokens",
    "micro_batches",
    "row_lengths",
    "split_to_count",
    "trim_rollout",
]


def row_lengths(rollout: RolloutBatch) -> tuple[Tensor, Tensor]:
    """Real prompt and response token counts ``([N], [N])`` (long) of each row; a multi-turn row's response counts
    its environment tokens too (attention 1 after the prompt; single-turn: exactly the response mask)."""
    prompt = rollout.attention_mask[:, : rollout.prompt_length].long().sum(-1)
    return prompt, rollout.attention_mask[:, rollout.prompt_length :].long().sum(-1)


def micro_batch_tokens(prompt: Tensor, response: Tensor, *, packed: bool) -> int:
    """Token positions one forward over these rows processes: ``sum(prompt + response)`` packed, else
    ``rows x (max prompt + max response)`` (the rows trimmed to the group's widths)."""
    if prompt.numel() == 0:
        return 0
    if packed:
        return int((prompt + response).sum())
    return prompt.numel() * int(prompt.max() + response.max())


def group_rows(
    prompt: Tensor, response: Tensor, max_tokens: int, *, max_rows: int | None = None, packed: bool = False
) -> list[Tensor]:
    """Rows ``0..n-1`` sorted by length and cut greedily into groups of at most ``max_tokens`` positions each
    (:func:`micro_batch_tokens`) and at most ``max_rows`` rows; a row over the budget alone is a group."""
    order = torch.argsort(prompt + response, stable=True).tolist()
    groups: list[list[int]] = []
    current: list[int] = []
    for row in order:
        candidate = current + [row]
        tokens = micro_batch_tokens(prompt[candidate], response[candidate], packed=packed)
        if current and (tokens > max_tokens or (max_rows is not None and len(candidate) > max_rows)):
            groups.append(current)
            candidate = [row]
        current = candidate
    if current:
        groups.append(current)
    return [torch.tensor(g, dtype=torch.long) for g in groups]


def split_to_count(groups: list[Tensor], count: int) -> list[Tensor]:
    """``groups`` split until there are ``count``: the group with the most rows is halved (each half fits the
    budget its whole did); with no group of two rows left, empty groups fill up (the rank then runs a forward
    that contributes nothing, see :func:`micro_batch_plan`)."""
    groups = list(groups)
    while len(groups) < count:
        largest = max(range(len(groups)), key=lambda i: groups[i].numel()) if groups else None
        if largest is None or groups[largest].numel() < 2:
            groups.append(torch.empty(0, dtype=torch.long))
            continue
        group = groups.pop(largest)
        half = group.numel() // 2
        groups[largest:largest] = [group[:half], group[half:]]
    return groups


def micro_batch_plan(
    rollout: RolloutBatch, index: Tensor, max_tokens: int, *, max_rows: int | None = None, packed: bool = False
) -> list[Tensor]:
    """The micro-batches of the rows ``index`` of ``rollout``: row-index tensors into ``rollout``, the same
    number on every rank (a collective: every rank calls it once per mini-batch).

    Args:
        rollout: the whole rollout batch.
        index: ``[n]`` the mini-batch's rows.
        max_tokens: ``model.update.max_tokens_per_micro_batch``.
        max_rows: ``model.update.micro_batch_size`` (also a limit when set).
        packed: rows are packed (budget = real tokens) rather than padded to the group's widths.

    Returns:
        Index tensors (on ``index``'s device); an empty one where this rank has fewer rows than micro-batches.
    """
    prompt, response = (t[index].cpu() for t in row_lengths(rollout))
    groups = group_rows(prompt, response, max_tokens, max_rows=max_rows, packed=packed)
    count = int(all_reduce_max(torch.tensor([len(groups)], device=index.device)).item())
    return [index[g.to(index.device)] for g in split_to_count(groups, count)]


def trim_rollout(rollout: RolloutBatch) -> RolloutBatch:
    """``rollout`` without the left prompt columns that are padding on every row and the response columns past
    every row's response mask (causal attention: dropping later columns changes nothing before them)."""
    prompt, response = row_lengths(rollout)
    width = int(response.max()) if response.numel() else 0
    start = rollout.prompt_length - (int(prompt.max()) if prompt.numel() else 0)
    stop = rollout.prompt_length + max(width, 1)
    logprobs, environment = rollout.rollout_logprobs, rollout.environment_mask
    return RolloutBatch(
        sequences=rollout.sequences[:, start:stop],
        attention_mask=rollout.attention_mask[:, start:stop],
        response_mask=rollout.response_mask[:, : max(width, 1)],
        rollout_logprobs=None if logprobs is None else logprobs[:, : max(width, 1)],
        environment_mask=None if environment is None else environment[:, : max(width, 1)],
        trajectories=rollout.trajectories,
    )


@overload
def micro_batches(rollout: RolloutBatch, update: UpdateConfig, index: Tensor) -> list[Tensor]: ...
@overload
def micro_batches(rollout: RolloutBatch, update: UpdateConfig, index: None = None) -> list[Tensor | slice]: ...
def micro_batches(
    rollout: RolloutBatch, update: UpdateConfig, index: Tensor | None = None
) -> list[Tensor] | list[Tensor | slice]:
    """The forwards over the rows ``index`` (None: all) of ``rollout``: :func:`micro_batch_plan` under
    ``update.max_tokens_per_micro_batch`` (a collective), else consecutive ``update.micro_batch_size`` rows
    (slices when ``index`` is None)."""
    rows = rollout.response_mask.shape[0] if index is None else index.numel()
    if update.max_tokens_per_micro_batch is None:
        slices: list[Tensor | slice] = list(row_slices(rows, update.micro_batch_size))
        return slices if index is None else [index[s] for s in slices]
    index = torch.arange(rows, device=rollout.response_mask.device) if index is None else index
    budget, rows_limit = update.max_tokens_per_micro_batch, update.micro_batch_size
    return micro_batch_plan(rollout, index, budget, max_rows=rows_limit, packed=update.pack_sequences)


def forward_rows(part: Tensor | slice) -> Tensor | slice:
    """The rows a forward runs on: ``part``, or row 0 for an empty index (that rank's forward only keeps the
    ranks' collectives in step; what it computes is dropped)."""
    if isinstance(part, Tensor) and not part.numel():
        return torch.zeros(1, dtype=torch.long, device=part.device)
    return part


def forward_parts(rollout: RolloutBatch, plan: list[Tensor | slice]) -> Iterator[tuple[Tensor | slice, RolloutBatch]]:
    """``(rows, rollout of those rows)`` per forward of the statistics pass, one per part of ``plan``
    (:func:`micro_batches`, or ``[slice(None)]`` for one forward over all rows): a token-budget part (an index
    tensor) trimmed to its widths and an empty one run on row 0 (see :func:`forward_rows`)."""
    for index in plan:
        part = rollout.select(forward_rows(index))
        yield index, (trim_rollout(part) if isinstance(index, Tensor) else part)

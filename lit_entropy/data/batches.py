"""The tokenized prompts of one split and the collator that batches them (left-padded), as
:class:`~lit_entropy.data.datamodule.PromptDataModule` serves them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.utils.data import Dataset

__all__ = ["PromptCollator", "PromptDataset"]


class PromptDataset(Dataset[dict[str, Any]]):
    """Map-style dataset of tokenized prompts (map-style so Lightning injects a ``DistributedSampler``).

    Args:
        input_ids: Token ids of each rendered prompt (unpadded).
        prompts: Rendered prompt text (after template / chat template), one per row.
        answers: Ground-truth answer string, one per row.
        classes: Class (or source) name of each row, for per-class validation metrics; None = no classes.
    """

    def __init__(
        self, input_ids: list[list[int]], prompts: list[str], answers: list[str], classes: list[str] | None = None
    ) -> None:
        if not len(input_ids) == len(prompts) == len(answers) == len(answers if classes is None else classes):
            raise ValueError(
                f"input_ids, prompts, answers (and classes) must have equal lengths, got "
                f"{len(input_ids)}, {len(prompts)}, {len(answers)}" + ("" if classes is None else f", {len(classes)}")
            )
        self.input_ids = input_ids
        self.prompts = prompts
        self.answers = answers
        self.classes = classes

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = {"input_ids": self.input_ids[index], "prompt": self.prompts[index], "answer": self.answers[index]}
        if self.classes is not None:
            row["class"] = self.classes[index]
        return row


class PromptCollator:
    """Collate :class:`PromptDataset` rows into a left-padded batch (a class, so it pickles for workers).

    Returns a dict with ``input_ids`` ``[B, L]`` (int64, left-padded with ``pad_token_id``),
    ``attention_mask`` ``[B, L]`` (int64, 1 on real tokens), ``prompts`` (list of B str) and ``answers``
    (list of B str), plus ``classes`` (list of B str) when the rows have a ``class``; ``L`` is the longest
    prompt of the batch. Left padding keeps every prompt's last
    token in the last column, which batched decoder-only generation needs.

    Args:
        pad_token_id: Id written into the padding positions.
    """

    def __init__(self, pad_token_id: int) -> None:
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
            raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
        self.pad_token_id = pad_token_id

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Tensor | list[str]]:
        if not rows:
            raise ValueError("rows must be a non-empty sequence, got an empty one")
        width = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids = row["input_ids"]
            if ids:  # ``t[i, -0:]`` would address the whole row
                input_ids[i, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
                attention_mask[i, width - len(ids) :] = 1
        batch: dict[str, Tensor | list[str]] = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "prompts": [row["prompt"] for row in rows],
            "answers": [row["answer"] for row in rows],
        }
        if "class" in rows[0]:
            batch["classes"] = [row["class"] for row in rows]
        return batch

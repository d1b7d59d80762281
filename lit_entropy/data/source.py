"""What a training module may ask of its data side (a LightningDataModule or anything else)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["PromptSource"]


@runtime_checkable
class PromptSource(Protocol):
    """A data side that says how long its prompts are and how many prompts one training step takes."""

    def longest_prompt_tokens(self) -> int | None:
        """Longest tokenized prompt over the splits set up so far (None when nothing is set up yet)."""
        ...

    def prompts_per_step(self) -> int:
        """Prompts per training batch, per rank."""
        ...

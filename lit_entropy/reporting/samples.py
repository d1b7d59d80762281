"""The samples a training step shows: a table of whole sample groups, the most informative first, and the
token-entropy histogram (``train/samples``, ``train/entropy/tokens``)."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from lit_entropy.reporting.multi_turn import conversation_cells

__all__ = ["informative_groups", "log_samples", "samples_markdown"]


def _cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", " ")[:300]


def informative_groups(rewards: Tensor, group_size: int) -> list[int]:
    """Prompt indices, groups whose rewards differ most first (reward std within the group, descending).

    A group whose samples all got the same reward has zero advantages under group normalisation and teaches
    nothing: those come last, in batch order (ties keep batch order too).

    Args:
        rewards: ``[prompts * group_size]``, ``group_size`` consecutive rewards per prompt.
        group_size: samples per prompt.
    """
    stds = rewards.detach().double().cpu().view(-1, group_size).std(-1, unbiased=False)
    spread = [round(value, 9) for value in stds.tolist()]  # groups with the same rewards in another order tie
    return sorted(range(len(spread)), key=lambda index: -spread[index])


def samples_markdown(
    prompts: list[str],
    answers: list[str],
    completions: list[str],
    rewards: Tensor,
    advantages: Tensor,
    group_size: int,
    num_prompts: int,
) -> str:
    """Every completion of ``num_prompts`` prompts (whole GRPO groups) as a Markdown table, the most informative
    groups first (:func:`informative_groups`).

    Args:
        prompts: one per prompt.
        answers: one per prompt.
        completions: ``group_size`` consecutive completions per prompt.
        rewards: ``[len(completions)]``.
        advantages: ``[len(completions)]``, the advantage of each completion (its first token's).
        group_size: completions per prompt.
        num_prompts: how many prompts to show.
    """
    lines = ["| prompt | answer | # | completion | reward | advantage |", "|---|---|---|---|---|---|"]
    for prompt_idx in informative_groups(rewards, group_size)[:num_prompts]:
        for sample in range(group_size):
            row = prompt_idx * group_size + sample
            head = (_cell(prompts[prompt_idx]), _cell(answers[prompt_idx])) if sample == 0 else ("", "")
            lines.append(
                f"| {head[0]} | {head[1]} | {sample} | {_cell(completions[row])} | "
                f"{float(rewards[row]):.3g} | {float(advantages[row]):+.3g} |"
            )
    return "\n".join(lines)


def log_samples(
    writer: Any, step: int, experience: Any, batch: dict[str, Any], completions: list[str], num_prompts: int,
    tokenizer: Any = None,
) -> None:  # fmt: skip
    """Write the token-entropy histogram and a table of whole sample groups to a TensorBoard ``writer``; a multi-turn
    row shows its whole conversation with roles and its masked spans (``tokenizer`` decodes them).

    Use ``step = lit_entropy.internals.lightning.logger_step(trainer)`` so they line up with the step's scalars.
    """
    mask = experience.response_mask
    group = len(completions) // len(batch["prompts"])
    if experience.rollout.trajectories is not None and tokenizer is not None:
        completions = conversation_cells(experience.rollout, tokenizer)
    writer.add_histogram("train/entropy/tokens", experience.entropy[mask].float().cpu(), step)
    first = experience.advantages[:, 0] if experience.advantages.dim() == 2 else experience.advantages
    table = samples_markdown(
        batch["prompts"], batch["answers"], completions, experience.rewards, first, group, num_prompts
    )
    writer.add_text("train/samples", table, step)

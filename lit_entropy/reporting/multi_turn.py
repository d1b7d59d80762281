"""What multi-turn rollouts log: ``train/multi_turn/*`` scalars and the samples table of whole conversations.

Every count is global (summed over ranks in one all-reduce), so each rank logs the same numbers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.functional.overlong import truncated_rows
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.rollout.trajectories import STOP_REASONS, Trajectories

__all__ = ["conversation_cells", "multi_turn_scalars", "trajectory_segments", "truncated_trajectories"]

PREFIX = "train/multi_turn"


def multi_turn_scalars(rollout: RolloutBatch) -> dict[str, float]:
    """``train/multi_turn/*`` of a multi-turn rollout batch (every rank must call it: one all-reduce).

    - ``turns``, ``tool_calls``: means per trajectory; ``tool_error_rate``: failed calls over calls (0 without any);
    - ``environment_token_frac``: environment tokens over all trajectory tokens (policy + environment);
    - ``environment_reward``: the environment's reward, mean per trajectory;
    - ``stop/<reason>``: the share of trajectories that stopped for each of :data:`STOP_REASONS`.
    """
    records = rollout.trajectories
    if records is None or rollout.environment_mask is None:
        raise ValueError("multi_turn_scalars needs a multi-turn rollout batch (trajectories and environment_mask)")
    device = records.turns.device
    sums = [
        torch.tensor(float(records.turns.numel())),
        records.turns.sum(),
        records.tool_calls.sum(),
        records.tool_errors.sum(),
        rollout.environment_mask.sum(),
        rollout.response_mask.sum(),
        records.environment_rewards.sum(),
        *(records.stopped(reason).sum() for reason in STOP_REASONS),
    ]
    total = all_reduce_sum(torch.stack([s.to(device=device, dtype=torch.float64) for s in sums])).tolist()
    rows, turns, calls, errors, env_tokens, policy_tokens, env_reward, *stops = total
    out = {
        f"{PREFIX}/turns": turns / max(rows, 1.0),
        f"{PREFIX}/tool_calls": calls / max(rows, 1.0),
        f"{PREFIX}/tool_error_rate": errors / max(calls, 1.0),
        f"{PREFIX}/environment_token_frac": env_tokens / max(env_tokens + policy_tokens, 1.0),
        f"{PREFIX}/environment_reward": env_reward / max(rows, 1.0),
    }
    out.update({f"{PREFIX}/stop/{reason}": n / max(rows, 1.0) for reason, n in zip(STOP_REASONS, stops, strict=True)})
    return out


def trajectory_segments(rollout: RolloutBatch, row: int) -> list[tuple[bool, list[int]]]:
    """Row ``row``'s trajectory as runs of ``(trained, ids)``: policy tokens (True) and environment tokens (False),
    in order."""
    environment = rollout.environment_mask
    width = int(rollout.attention_mask[row, rollout.prompt_length :].sum())
    ids = rollout.responses[row, :width].tolist()
    trained = rollout.response_mask[row, :width].tolist() if environment is not None else [True] * width
    segments: list[tuple[bool, list[int]]] = []
    for token, policy in zip(ids, trained, strict=True):
        if segments and segments[-1][0] == policy:
            segments[-1][1].append(token)
        else:
            segments.append((policy, [token]))
    return segments


def conversation_cell(rollout: RolloutBatch, row: int, tokenizer: Any) -> str:
    """One trajectory as text for the samples table: each policy turn as ``**assistant**: ...`` and each environment
    span (masked out of the loss: tool results, observations, the template's turn markers) as
    ``[masked <roles>: ...]``, decoded exactly from the tokens trained on."""
    records: Trajectories | None = rollout.trajectories
    conversation = [] if records is None else records.conversations[row]
    # The roles of the environment messages between consecutive assistant turns.
    between: list[list[str]] = [[]]
    for message in conversation:
        if message["role"] == "assistant":
            between.append([])
        else:
            between[-1].append(message["role"])
    parts, turn = [], 0
    for trained, ids in trajectory_segments(rollout, row):
        text = tokenizer.decode(ids, skip_special_tokens=False)
        if trained:
            turn += 1
            parts.append(f"**assistant**: {text}")
        else:
            roles = "/".join(dict.fromkeys(between[turn] if turn < len(between) else [])) or "environment"
            parts.append(f"[masked {roles}: {text}]")
    return " ".join(parts)


def conversation_cells(rollout: RolloutBatch, tokenizer: Any) -> list[str]:
    """:func:`conversation_cell` of every row, with its stop reason."""
    records = rollout.trajectories
    if records is None:
        raise ValueError("conversation_cells needs a multi-turn rollout batch")
    reasons = [STOP_REASONS[int(i)] for i in records.stop_reasons.tolist()]
    return [f"{conversation_cell(rollout, row, tokenizer)} (stop: {reason})" for row, reason in enumerate(reasons)]


def truncated_trajectories(rollout: RolloutBatch, max_new_tokens: int, eos_token_ids: list[int]) -> Tensor:
    """``[N]`` bool, the rows cut by the length limit: a multi-turn row whose budget ran out (stop reason ``length``),
    a single-turn row of ``max_new_tokens`` tokens not ending in EOS (:func:`~lit_entropy.functional.truncated_rows`).
    """
    if rollout.trajectories is not None:
        return rollout.trajectories.truncated
    mask = rollout.response_mask
    return truncated_rows(rollout.responses, mask, max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids)

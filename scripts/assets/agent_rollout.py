"""Supervised batches and a small multi-turn sampler for the tiny agent demonstrations' base models.

Independent of the library's rollout loop on purpose: the base-model builders and the demonstrations' evaluation
(``scripts/demos``) measure the models with this plain loop (Hugging Face ``generate`` per turn, environment
messages rendered by the chat template and appended as ids), so a bug in ``lit_entropy``'s multi-turn rollouts
cannot hide in the figures that judge it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from scripts.assets.sft import pad_right, sampled_ids

__all__ = [
    "Trajectory",
    "hermes_call",
    "message_ids",
    "play_text_environment",
    "play_trajectories",
    "sample_turns",
    "supervised_batch",
]

_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def message_ids(tokenizer: Any, message: dict[str, str]) -> list[int]:
    """Ids of one message rendered alone by the (concatenating, prefix-stable) chat template."""
    text = tokenizer.apply_chat_template([message], tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def supervised_batch(conversations: list[list[dict[str, str]]], tokenizer: Any) -> dict[str, torch.Tensor]:
    """Right-padded teacher-forcing batch of whole conversations; labels are -100 except on assistant messages
    (their text and the ``<eos>`` that ends each turn)."""
    rows, labels = [], []
    for messages in conversations:
        ids: list[int] = []
        lab: list[int] = []
        for m in messages:
            piece = message_ids(tokenizer, m)
            ids += piece
            lab += piece if m["role"] == "assistant" else [-100] * len(piece)
        rows.append(ids)
        labels.append(lab)
    return pad_right(rows, labels, tokenizer.pad_token_id)


def hermes_call(text: str) -> tuple[str, dict[str, Any]] | None:
    """``(name, arguments)`` of the first ``<tool_call>{json}</tool_call>`` in ``text``; None when there is none
    or it is not a JSON object with a string ``name`` and an object ``arguments``."""
    match = _CALL.search(text)
    if match is None:
        return None
    try:
        payload = json.loads(match.group(1))
    except json.JSONDecodeError:
        return None
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return None
    arguments = payload.get("arguments", {})
    return (payload["name"], arguments) if isinstance(arguments, dict) else None


@torch.no_grad()
def sample_turns(model: Any, tokenizer: Any, contexts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """One sampled turn (T = 1, no top-k / top-p) per context, cut after its first ``<eos>`` (kept)."""
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, c in enumerate(contexts):  # left padding, as batched generation needs
        ids[i, width - len(c) :] = torch.tensor(c)
        att[i, width - len(c) :] = 1
    out = sampled_ids(model, tokenizer, {"input_ids": ids, "attention_mask": att}, max_new_tokens)
    out = out[:, width:].tolist()
    turns = []
    for row in out:
        cut = row.index(tokenizer.eos_token_id) + 1 if tokenizer.eos_token_id in row else len(row)
        turns.append(row[:cut])
    return turns


@dataclass
class Trajectory:
    """One sampled conversation: its policy turns' texts (no ``<eos>``) and the environment's replies."""

    turns: list[str] = field(default_factory=list)
    replies: list[str] = field(default_factory=list)
    called: bool = False
    reward: float = 0.0
    done: bool = False


def play_trajectories(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    samples: int,
    seed: int,
    call_tokens: int,
    answer_tokens: int,
    tool: Callable[[str], str],
) -> list[Trajectory]:
    """``samples`` calculator trajectories per prompt: a first turn; where it calls ``calculate``, the tool's
    result (or its error) as a tool message and a second turn. Rows ``i * samples ...`` answer prompt ``i``."""
    torch.manual_seed(seed)
    model.eval()
    contexts = [message_ids(tokenizer, {"role": "user", "content": p}) for p in prompts for _ in range(samples)]
    first = sample_turns(model, tokenizer, contexts, call_tokens)
    trajectories = [Trajectory(turns=[tokenizer.decode(t, skip_special_tokens=True)]) for t in first]
    again = []
    for i, (traj, turn) in enumerate(zip(trajectories, first, strict=True)):
        call = hermes_call(traj.turns[0])
        if call is None:
            continue
        traj.called = True
        name, arguments = call
        try:
            if name != "calculate" or set(arguments) != {"expression"}:
                raise ValueError(f"unknown tool or arguments: {name} {sorted(arguments)}")
            result = tool(arguments["expression"])
        except Exception as err:  # the policy reads the error, as the library's tool loop does
            result = f"error:{type(err).__name__}"
        traj.replies.append(result)
        contexts[i] = contexts[i] + turn + message_ids(tokenizer, {"role": "tool", "content": result})
        again.append(i)
    if again:
        second = sample_turns(model, tokenizer, [contexts[i] for i in again], answer_tokens)
        for i, turn in zip(again, second, strict=True):
            trajectories[i].turns.append(tokenizer.decode(turn, skip_special_tokens=True))
    model.train()
    return trajectories


def play_text_environment(
    model: Any,
    tokenizer: Any,
    rows: list[dict[str, Any]],
    make_environment: Callable[[], Any],
    *,
    samples: int,
    seed: int,
    max_turns: int,
    turn_tokens: int,
) -> list[Trajectory]:
    """``samples`` games per row against fresh text environments (``reset(row)``, ``step(text)``): each policy turn
    is sampled, the environment answers, and its observation (a user message) is appended as ids, until it says
    done or ``max_turns`` turns. ``reward`` sums the environment's rewards. Rows ``i * samples ...`` play row ``i``."""
    torch.manual_seed(seed)
    model.eval()
    environments, trajectories, contexts = [], [], []
    for row in rows:
        for _ in range(samples):
            env = make_environment()
            first = env.reset(dict(row))
            ids = message_ids(tokenizer, {"role": "user", "content": row["prompt"]})
            if first:
                ids += message_ids(tokenizer, {"role": "user", "content": first})
            environments.append(env)
            trajectories.append(Trajectory())
            contexts.append(ids)
    live = list(range(len(contexts)))
    for turn_index in range(max_turns):
        if not live:
            break
        turns = sample_turns(model, tokenizer, [contexts[i] for i in live], turn_tokens)
        still = []
        for i, turn in zip(live, turns, strict=True):
            text = tokenizer.decode(turn, skip_special_tokens=True)
            observation, reward, done = environments[i].step(text)
            traj = trajectories[i]
            traj.turns.append(text)
            traj.reward += reward
            if done or turn_index == max_turns - 1:
                traj.done = done
                continue
            traj.replies.append(observation)
            contexts[i] = contexts[i] + turn + message_ids(tokenizer, {"role": "user", "content": observation})
            still.append(i)
        live = still
    model.train()
    return trajectories

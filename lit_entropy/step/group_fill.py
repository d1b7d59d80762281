"""DAPO dynamic sampling (Lightning-free): keep the groups whose correctness varies, over several generation batches.

A group whose samples are all correct or all wrong has zero GRPO advantage for every sample: it costs an update's
compute and carries no policy-gradient signal. With ``model.sampling.filter_groups`` each generation batch keeps
only its informative groups in a :class:`GroupFill`; the update runs once the fill holds a batch of them (or
``max_gen_batches`` generations were made). Between the generations of one fill the policy does not change, so
every kept group is on-policy. The fill is plain data (:meth:`GroupFill.state_dict`): a checkpoint written
between two generations of a fill holds it, and a resumed run continues the same fill.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from lit_entropy.distributed.collectives import all_gather_equal, all_gather_objects, is_distributed
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.rollout.trajectories import Trajectories
from lit_entropy.settings import RFTSettings
from lit_entropy.step.estimator_inputs import PER_PROMPT_KEYS
from lit_entropy.step.schedule import schedule_horizon

__all__ = [
    "DynamicSampling",
    "FillCounts",
    "FillStep",
    "FilledBatch",
    "GroupFill",
    "advance_fill",
    "cat_rollouts",
    "fill_counts",
    "fill_from_checkpoint",
    "fill_to_checkpoint",
    "informative_groups",
    "left_pad_cat",
]

_ROLLOUT_KEYS = ("sequences", "attention_mask", "response_mask", "rollout_logprobs", "environment_mask", "trajectories")
# Batch lists with one item per prompt, kept or dropped with its group (the estimator's inputs too: remax's greedy
# baseline, the reward's named components).
_PROMPT_KEYS = ("prompts", "answers", "classes", *PER_PROMPT_KEYS)


def informative_groups(rewards: Tensor, group_size: int, correct_threshold: float) -> Tensor:
    """``[G]`` bool: True for the groups whose samples are neither all correct nor all wrong.

    Args:
        rewards: ``[G * group_size]`` rewards as scored (no overlong penalty), rows grouped by prompt.
        group_size: samples per prompt.
        correct_threshold: a sample is correct when its reward is ``>=`` this (``model.reward.correct_threshold``).
    """
    correct = (rewards >= correct_threshold).view(-1, group_size)
    return correct.any(-1) & ~correct.all(-1)


def left_pad_cat(parts: Sequence[Tensor], pad: float | int | bool) -> Tensor:
    """Concatenate ``[n_i, L_i]`` tensors along rows, left-padding each to the longest ``L`` with ``pad``."""
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (width - p.shape[1], 0), value=pad) for p in parts])


def _right_pad_cat(parts: Sequence[Tensor], pad: float | int | bool) -> Tensor:
    width = max(p.shape[1] for p in parts)
    return torch.cat([torch.nn.functional.pad(p, (0, width - p.shape[1]), value=pad) for p in parts])


def cat_rollouts(rollouts: Sequence[RolloutBatch], pad_token_id: int) -> RolloutBatch:
    """Rows of several rollout batches as one: prompts left-padded to the longest prompt, responses right-padded
    to the longest response (padding is ``pad_token_id``, attention 0, response mask False, log-prob 0)."""
    prompts = [r.sequences[:, : r.prompt_length] for r in rollouts]
    prompt_masks = [r.attention_mask[:, : r.prompt_length] for r in rollouts]
    response_masks = [r.attention_mask[:, r.prompt_length :] for r in rollouts]
    responses = _right_pad_cat([r.responses for r in rollouts], pad_token_id)
    sequences = torch.cat([left_pad_cat(prompts, pad_token_id), responses], 1)
    attention = torch.cat([left_pad_cat(prompt_masks, 0), _right_pad_cat(response_masks, 0)], 1)
    logprobs = [r.rollout_logprobs for r in rollouts]
    environment = [r.environment_mask for r in rollouts]
    records = [r.trajectories for r in rollouts]
    return RolloutBatch(
        sequences=sequences,
        attention_mask=attention,
        response_mask=_right_pad_cat([r.response_mask for r in rollouts], False),
        rollout_logprobs=None if any(p is None for p in logprobs) else _right_pad_cat(logprobs, 0.0),  # type: ignore[arg-type]
        # multi-turn rows: responses are right-padded, so their columns (and per-turn reward columns) stay
        environment_mask=None if any(e is None for e in environment) else _right_pad_cat(environment, False),  # type: ignore[arg-type]
        trajectories=None if any(t is None for t in records) else Trajectories.cat(records),  # type: ignore[arg-type]
    )


class FilledBatch(NamedTuple):
    """The groups an update trains on, as one generation batch would hold them.

    Attributes:
        batch: ``input_ids`` / ``attention_mask`` ``[G, P]`` (left-padded), ``prompts``, ``answers`` (and ``classes``).
        rollout: ``G * group_size`` rows, grouped by prompt.
        rewards: ``[G * group_size]`` rewards as scored.
        completions: the decoded completions, one per row.
    """

    batch: dict[str, Any]
    rollout: RolloutBatch
    rewards: Tensor
    completions: list[str]


@dataclass(frozen=True)
class GroupFill:
    """Informative groups collected for the next update (immutable: :meth:`add` returns a new fill).

    Attributes:
        pieces: per generation batch that kept a group, its kept rows (plain tensors, lists and strings).
        gen_batches: generation batches drawn into this fill.
        groups_drawn: groups (prompts) generated for it on this rank.
    """

    pieces: tuple[dict[str, Any], ...] = ()
    gen_batches: int = 0
    groups_drawn: int = 0

    @property
    def groups_kept(self) -> int:
        """Informative groups held on this rank."""
        return sum(len(piece["answers"]) for piece in self.pieces)

    def add(
        self, batch: dict[str, Any], rollout: RolloutBatch, rewards: Tensor, completions: list[str], keep: Tensor
    ) -> GroupFill:
        """This fill plus one generation batch, of which the groups with ``keep`` ``[G]`` True are kept."""
        groups = keep.numel()
        group_size = rewards.numel() // groups
        kept = keep.nonzero().flatten()
        rows = (kept.unsqueeze(-1) * group_size + torch.arange(group_size, device=kept.device)).flatten()
        pieces = self.pieces
        if kept.numel():
            piece: dict[str, Any] = {
                "input_ids": batch["input_ids"][kept.to(batch["input_ids"].device)],
                "prompt_attention_mask": batch["attention_mask"][kept.to(batch["attention_mask"].device)],
                "rewards": rewards[rows.to(rewards.device)],
                "completions": [completions[i] for i in rows.tolist()],
            }
            for key in _PROMPT_KEYS:
                if key in batch:
                    piece[key] = [batch[key][i] for i in kept.tolist()]
            selected = rollout.select(rows.to(rollout.sequences.device))
            piece.update({key: getattr(selected, key) for key in _ROLLOUT_KEYS})
            pieces = (*pieces, piece)
        return GroupFill(pieces, self.gen_batches + 1, self.groups_drawn + groups)

    def take(self, groups: int, pad_token_id: int, device: torch.device | None = None) -> FilledBatch:
        """The first ``groups`` kept groups as one batch (the rest are dropped), on ``device``."""
        pieces, left = [], groups
        for piece in self.pieces:
            if left <= 0:
                break
            n, size = min(left, len(piece["answers"])), piece["rewards"].numel() // len(piece["answers"])
            pieces.append(_head(piece, n, n * size))
            left -= n
        if left > 0:
            raise ValueError(f"take({groups}) from a fill of {self.groups_kept} groups")
        if device is not None:
            pieces = [{k: v.to(device) if isinstance(v, Tensor) else v for k, v in p.items()} for p in pieces]
        rollout = cat_rollouts(
            # .get: a fill checkpointed before multi-turn rows were kept has no environment_mask / trajectories
            [RolloutBatch(**{key: piece.get(key) for key in _ROLLOUT_KEYS}) for piece in pieces],  # type: ignore[arg-type]
            pad_token_id,
        )
        batch: dict[str, Any] = {
            "input_ids": left_pad_cat([p["input_ids"] for p in pieces], pad_token_id),
            "attention_mask": left_pad_cat([p["prompt_attention_mask"] for p in pieces], 0),
        }
        for key in _PROMPT_KEYS:
            if key in pieces[0]:
                batch[key] = [item for p in pieces for item in p[key]]
        rewards = torch.cat([p["rewards"] for p in pieces])
        return FilledBatch(batch, rollout, rewards, [c for p in pieces for c in p["completions"]])

    def state_dict(self) -> dict[str, Any]:
        """Plain data for a checkpoint (tensors on the CPU; multi-turn records as :meth:`Trajectories.state_dict`)."""
        pieces = [{k: _plain(v) for k, v in p.items()} for p in self.pieces]
        return {"pieces": pieces, "gen_batches": self.gen_batches, "groups_drawn": self.groups_drawn}

    @classmethod
    def from_state_dict(cls, state: dict[str, Any]) -> GroupFill:
        """The fill :meth:`state_dict` described."""
        pieces = []
        for piece in state["pieces"]:
            piece = dict(piece)
            if isinstance(piece.get("trajectories"), dict):
                piece["trajectories"] = Trajectories.from_state_dict(piece["trajectories"])
            pieces.append(piece)
        return cls(tuple(pieces), int(state["gen_batches"]), int(state["groups_drawn"]))


def _plain(value: Any) -> Any:
    """A piece's value as checkpoint data."""
    if isinstance(value, Tensor):
        return value.cpu()
    return value.state_dict() if isinstance(value, Trajectories) else value


def _head(piece: dict[str, Any], groups: int, rows: int) -> dict[str, Any]:
    """The first ``groups`` groups (``rows`` rows) of a piece."""
    per_group = {"input_ids", "prompt_attention_mask", *_PROMPT_KEYS}
    return {
        k: v[:groups]
        if k in per_group
        else (v.select(slice(0, rows)) if isinstance(v, Trajectories) else _rows(v, rows))
        for k, v in piece.items()
    }


def _rows(value: Any, rows: int) -> Any:
    return None if value is None else value[:rows]


@dataclass(frozen=True)
class FillCounts:
    """A fill's counts over all ranks (the same on every rank).

    Attributes:
        least_kept: the fewest informative groups any rank holds.
        kept: informative groups held, summed over ranks.
        drawn: groups generated for the fill, summed over ranks.
        ranks: number of ranks.
    """

    least_kept: int
    kept: int
    drawn: int
    ranks: int = 1


def fill_counts(fill: GroupFill, device: torch.device) -> FillCounts:
    """Every rank's kept and drawn groups (one all-gather: every rank must call it)."""
    local = torch.tensor([fill.groups_kept, fill.groups_drawn], dtype=torch.long, device=device)
    gathered = all_gather_equal(local).view(-1, 2).tolist()
    kept = [row[0] for row in gathered]
    drawn = sum(row[1] for row in gathered)
    return FillCounts(least_kept=min(kept), kept=sum(kept), drawn=drawn, ranks=len(gathered))


@dataclass(frozen=True)
class FillStep:
    """What one generation batch did to the fill.

    Attributes:
        fill: the fill after it (carry it to the next generation batch unless ``done``).
        done: the fill is finished: update now on ``train_groups`` groups (0: nothing to train on) and start anew.
        train_groups: groups every rank trains on: the batch size, or fewer when ``max_gen_batches`` ran out.
        counts: the fill's counts over all ranks.
    """

    fill: GroupFill
    done: bool
    train_groups: int
    counts: FillCounts


def advance_fill(
    fill: GroupFill,
    batch: dict[str, Any],
    rollout: RolloutBatch,
    rewards: Tensor,
    completions: list[str],
    *,
    correct_threshold: float,
    max_gen_batches: int,
) -> FillStep:
    """Add one scored generation batch to ``fill`` and decide, with the other ranks, whether the update runs.

    The target is a batch of the generation batch's size per rank. Every rank must call it once per generation
    batch (one all-gather): the ranks agree on finishing the fill and on training on the same number of groups,
    the fewest any of them holds, so the update's collectives match.
    """
    target = len(batch["answers"])
    keep = informative_groups(rewards, rewards.numel() // target, correct_threshold)
    fill = fill.add(batch, rollout, rewards, completions, keep)
    counts = fill_counts(fill, rewards.device)
    done = counts.least_kept >= target or fill.gen_batches >= max_gen_batches
    return FillStep(fill, done, min(target, counts.least_kept) if done else 0, counts)


def fill_to_checkpoint(fill: GroupFill) -> list[dict[str, Any]]:
    """Every rank's fill as plain data, in rank order, for the checkpoint rank 0 writes (collective)."""
    return all_gather_objects(fill.state_dict())


def fill_from_checkpoint(states: list[dict[str, Any]], rank: int, world_size: int) -> GroupFill | None:
    """This rank's fill from :func:`fill_to_checkpoint`'s ``states``; None when the checkpoint was written by a
    different number of ranks (each rank's fill belongs to its own share of the data: a new fill starts)."""
    if len(states) != world_size:
        return None
    return GroupFill.from_state_dict(states[rank])


CHECKPOINT_KEY = "lit_entropy_group_fill"


class DynamicSampling:
    """The training step's side of ``model.sampling.filter_groups``: the fill carried between generation batches.

    The step hands each scored generation batch to :meth:`offer` and trains on what it returns (None: no update in
    this step); it calls :meth:`commit` last, so a checkpoint written from inside a step (Ctrl-C) holds the fill the
    step started from. Without filtering, :meth:`offer` returns its input and nothing is kept or checkpointed.

    Args:
        settings: the run's settings (``model.sampling`` and ``model.reward.correct_threshold``).
        warn: called with a message when a fill ends with fewer groups than a batch (rank zero's warning).
    """

    def __init__(self, settings: RFTSettings, warn: Callable[[str], Any] = print) -> None:
        sampling = settings.sampling
        self.enabled, self.max_gen_batches = sampling.filter_groups, sampling.max_gen_batches
        self.correct_threshold, self.warn = settings.reward.correct_threshold, warn
        self.decaying_lr = settings.optim.lr_schedule != "constant"
        self.fill = GroupFill()
        self.last: FillStep | None = None  # the step that finished the fill of the latest update

    def offer(
        self, batch: dict[str, Any], rollout: RolloutBatch, rewards: Tensor, completions: list[str], pad_token_id: int
    ) -> FilledBatch | None:
        """The groups to update on now (every rank calls it once per generation batch), else None."""
        if not self.enabled:
            return FilledBatch(batch, rollout, rewards, completions)
        step = advance_fill(
            self.fill, batch, rollout, rewards, completions,
            correct_threshold=self.correct_threshold, max_gen_batches=self.max_gen_batches,
        )  # fmt: skip
        if step.done and step.train_groups < len(batch["answers"]):
            self.warn(
                f"lit_entropy: model.sampling.max_gen_batches={self.max_gen_batches} generation batches held fewer "
                "informative groups than a batch: the update trains on those (train/filter/*)"
            )
        if not step.done or not step.train_groups:  # the step ends here: keep the fill, or drop an empty one
            self.fill = GroupFill() if step.done else step.fill
            return None
        self.last = step
        return step.fill.take(step.train_groups, pad_token_id, rewards.device)

    def lr_horizon(self, stepping_batches: float, updates_per_batch: int, max_steps: int) -> int:
        """The LR schedule's length in optimizer steps (:func:`~lit_entropy.step.schedule.schedule_horizon`).

        The schedule advances once per optimizer step, so generation batches without an update leave it where it
        is; but how many updates a filtering run makes is known only afterwards. A decaying schedule is then sized
        for one update per generation batch and stops short of its end, unless ``max_steps`` (which counts
        optimizer steps) says how many updates to train: without it, a warning.
        """
        horizon = schedule_horizon(stepping_batches, updates_per_batch, max_steps)
        if self.enabled and self.decaying_lr and max_steps < 0:
            self.warn(
                "lit_entropy: model.sampling.filter_groups: the number of updates is known only afterwards, so the "
                f"decaying model.optim.lr_schedule spans {horizon} optimizer steps (one update per generation batch) "
                "and stops short of its end; set trainer.max_steps (it counts optimizer steps) to size it"
            )
        return horizon

    def samples_due(self, batch_idx: int, every: int) -> bool:
        """Whether the update at generation batch ``batch_idx`` logs samples, every ``every`` generation batches (0:
        never): when its fill drew one of the batches ``batch_idx`` is a multiple of ``every`` at (without filtering
        the update's own batch). An update that spans several generation batches would otherwise log samples only
        when the batch that ends its fill happens to fall on such a multiple."""
        drawn = self.last.fill.gen_batches if self.enabled and self.last is not None else 1
        return bool(every) and any((batch_idx - back) % every == 0 for back in range(drawn))

    def commit(self) -> None:
        """End of a step that updated: the next fill starts empty."""
        self.fill = GroupFill()

    def state_dict(self) -> dict[str, Any]:
        """``{CHECKPOINT_KEY: every rank's fill}`` for the checkpoint (collective; empty without filtering)."""
        return {CHECKPOINT_KEY: fill_to_checkpoint(self.fill)} if self.enabled else {}

    def load_state_dict(self, checkpoint: dict[str, Any]) -> None:
        """This rank's fill from a checkpoint (a fill written by another number of ranks is dropped, with a warning)."""
        states = checkpoint.get(CHECKPOINT_KEY)
        if not states:
            return
        rank, world = (dist.get_rank(), dist.get_world_size()) if is_distributed() else (0, 1)
        fill = fill_from_checkpoint(states, rank, world)
        if fill is None:
            self.warn(
                f"lit_entropy: the checkpoint's partial group fills are of {len(states)} ranks, not {world}: dropped"
            )
        self.fill = fill or GroupFill()

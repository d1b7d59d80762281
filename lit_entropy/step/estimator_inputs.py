"""What an advantage estimator reads besides the rewards: the reward's named components (``gdpo``) and the reward of
a greedy completion of each prompt (``remax``).

Both are kept per prompt in the batch dict, under :data:`REWARD_COMPONENTS` and :data:`REWARD_BASELINES`, so that
dynamic sampling's fill (``model.sampling.filter_groups``) keeps them with their groups as it keeps ``answers``;
:func:`estimator_inputs` turns them into the per-row tensors the estimator takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.overlong import overlong_penalty
from lit_entropy.functional.registry import estimator_needs_greedy_baseline
from lit_entropy.rollout.base import RolloutBatch, SamplingConfig
from lit_entropy.settings import RFTSettings

__all__ = [
    "PER_PROMPT_KEYS",
    "REWARD_BASELINES",
    "REWARD_COMPONENTS",
    "GreedySampling",
    "add_greedy_baselines",
    "component_rows",
    "estimator_inputs",
    "keep_components",
    "per_prompt_components",
]

REWARD_COMPONENTS = "reward_components"
"""Batch key: per prompt, ``{name: Tensor [group_size]}`` (the reward function's named components, float32)."""
REWARD_BASELINES = "reward_baselines"
"""Batch key: per prompt, the reward of its greedy completion (a float, the overlong penalty included)."""
PER_PROMPT_KEYS = (REWARD_COMPONENTS, REWARD_BASELINES)
"""The batch keys above: lists with one item per prompt, kept or dropped with the prompt's group."""


@dataclass(frozen=True)
class GreedySampling(SamplingConfig):
    """One greedy (temperature 0) completion per prompt: ``remax``'s baseline (its length limit is training's)."""

    _setting_prefix = "model.sampling."
    _greedy_allowed = True
    num_samples: int = 1
    temperature: float = 0.0


def per_prompt_components(components: Mapping[str, Tensor], group_size: int) -> list[dict[str, Tensor]]:
    """Named per-row components ``{name: [N]}`` as one ``{name: [group_size]}`` per prompt (rows grouped by prompt)."""
    names = list(components)
    if not names:
        return []
    prompts = components[names[0]].numel() // group_size
    return [{name: components[name][p * group_size : (p + 1) * group_size] for name in names} for p in range(prompts)]


def keep_components(batch: dict[str, Any], components: Mapping[str, Tensor] | None, group_size: int) -> None:
    """Put a scored batch's named reward components (``{name: [N]}``, or None: nothing) into ``batch`` per prompt."""
    if components is not None:
        batch[REWARD_COMPONENTS] = per_prompt_components(components, group_size)


def component_rows(per_prompt: list[dict[str, Tensor]]) -> tuple[tuple[str, ...], Tensor]:
    """The component names and ``[N, K]`` float32 values of the per-prompt dicts of :data:`REWARD_COMPONENTS`."""
    names = tuple(per_prompt[0])
    rows = torch.cat([torch.stack([prompt[name].float() for name in names], dim=-1) for prompt in per_prompt])
    return names, rows


def add_greedy_baselines(
    batch: dict[str, Any],
    settings: RFTSettings,
    generate: Callable[[dict[str, Any], SamplingConfig], RolloutBatch],
    score: Callable[[dict[str, Any], RolloutBatch, int], tuple[Tensor, list[str]]],
) -> None:
    """Generate and score one greedy completion per prompt of ``batch`` into ``batch[REWARD_BASELINES]`` when the
    estimator asks for it (``remax``), else nothing.

    The baseline gets the overlong penalty (``model.reward.overlong_buffer``) as the samples do, so ``r - b``
    compares one reward with another. The greedy rows enter no loss and no statistic but ``train/reward/greedy``.
    The step calls it for the prompts an update trains on (after dynamic sampling's filter, and under
    ``model.sampling.async_rollout`` with the current policy: a baseline that depends on the prompt only leaves the
    policy gradient unbiased, whichever policy produced it).

    Args:
        batch: the prompts (``input_ids``, ``attention_mask``, ``answers``).
        settings: the run's settings.
        generate: ``(batch, sampling) -> RolloutBatch`` (the module's rollout engine).
        score: ``(batch, rollout, num_samples) -> (rewards [P], completions)`` (the module's reward function).
    """
    if not estimator_needs_greedy_baseline(settings.advantages.estimator or ""):
        return
    sampling = GreedySampling(max_new_tokens=settings.sampling.max_new_tokens)
    rollout = generate(batch, sampling)
    rewards, _ = score(dict(batch), rollout, 1)  # a copy: the samples' reward components stay the batch's
    penalty = overlong_penalty(
        rollout.response_mask.sum(-1),
        max_new_tokens=sampling.max_new_tokens,
        buffer=settings.reward.overlong_buffer,
        factor=settings.reward.overlong_penalty_factor,
    )
    batch[REWARD_BASELINES] = (rewards + penalty.to(rewards)).tolist()


def estimator_inputs(
    batch: Mapping[str, Any] | None, group_size: int, weights: Mapping[str, float] | None = None
) -> dict[str, Any]:
    """The estimator keywords that ``batch`` carries: ``reward_baselines`` ``[N]`` (each prompt's greedy reward on
    its ``group_size`` rows), ``reward_components`` ``[N, K]`` with their ``reward_weights`` (``weights`` by name,
    1 for a name it lacks) and ``reward_component_names``."""
    out: dict[str, Any] = {}
    if batch is None:
        return out
    if batch.get(REWARD_BASELINES) is not None:
        baselines = torch.tensor(batch[REWARD_BASELINES], dtype=torch.float32)
        out["reward_baselines"] = baselines.repeat_interleave(group_size)
    if batch.get(REWARD_COMPONENTS):
        names, rows = component_rows(batch[REWARD_COMPONENTS])
        out["reward_components"] = rows
        out["reward_weights"] = [float((weights or {}).get(name, 1.0)) for name in names]
        out["reward_component_names"] = names
    return out

"""The statistics pass: the forwards over a rollout batch before its update, by the micro-batch plan (Lightning-free).

The pass computes what the update and the callbacks read of the rollout policy (old log-probs, entropy, ``S``,
reference log-probs, values). Its forwards follow the update's micro-batch plan
(:func:`~lit_entropy.step.micro_batches.micro_batches`: a token budget's rows trimmed to their widths), and when the
batch gets a single update (:func:`reuses_statistics_forward`) they keep their graphs and double as that update's
forwards (:attr:`~lit_entropy.step.RolloutStatistics.update_forward`) instead of being recomputed.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.settings import RFTSettings
from lit_entropy.step.experience import ReusedForwards, RolloutStatistics
from lit_entropy.step.forward import ResponseForward
from lit_entropy.step.micro_batches import forward_parts, micro_batches
from lit_entropy.step.schedule import single_update

__all__ = ["PartStatistics", "reuses_statistics_forward", "statistics_pass", "statistics_plan"]

PartStatistics = Callable[[RolloutBatch, bool], tuple[ResponseForward, RolloutStatistics]]
"""``(rows of one forward, keep the policy's graph) -> (the policy's forward, the rows' statistics)``."""


def reuses_statistics_forward(rows: int, settings: RFTSettings) -> bool:
    """True when the statistics pass doubles as the only update's forward (``model.update.reuse_statistics_forward``,
    no critic, one update on all ``rows``)."""
    update = settings.update
    return update.reuse_statistics_forward and settings.ppo is None and single_update(rows, update)


def statistics_plan(rollout: RolloutBatch, settings: RFTSettings, reuse: bool) -> list[Tensor | slice]:
    """The rows of each forward: one over all rows (``slice(None)``) when the single update reuses it without a
    token budget, else the update's micro-batches (a collective under a token budget)."""
    update = settings.update
    if reuse and update.max_tokens_per_micro_batch is None:
        return [slice(None)]
    return micro_batches(rollout, update)


def statistics_pass(
    rollout: RolloutBatch, settings: RFTSettings, part_statistics: PartStatistics, *, reuse: bool
) -> RolloutStatistics:
    """The statistics of ``rollout``, one ``part_statistics`` call per forward of :func:`statistics_plan`, in row order.

    Args:
        rollout: the sampled batch (``N`` rows).
        settings: the run's settings (the micro-batch plan).
        part_statistics: the forwards over one part's rows (trimmed to their widths under a token budget); its
            second argument says whether the policy's forward keeps its graph.
        reuse: keep the policy's forwards for the update (:func:`reuses_statistics_forward`).
    """
    parts: list[tuple[Tensor | slice, RolloutStatistics]] = []
    forwards: ReusedForwards = []
    for index, part in forward_parts(rollout, statistics_plan(rollout, settings, reuse)):
        forward, stats = part_statistics(part, reuse)
        parts.append((index, stats))
        forwards += [(index, forward)] if reuse else []
    statistics = RolloutStatistics.in_row_order(parts, rollout.response_mask.shape[1])
    return statistics.with_row_tensors({}, update_forward=forwards or None)

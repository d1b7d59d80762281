"""How a rollout batch is cut into optimizer steps, and the learning-rate schedule (Lightning-free)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import Tensor

from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.settings import OptimConfig, UpdateConfig

__all__ = [
    "build_optimizer",
    "clip_grad_norm_and_agree",
    "lr_multiplier",
    "optimizer_step_rows",
    "row_slices",
    "schedule_horizon",
    "single_update",
    "updates_per_batch",
]


def row_slices(rows: int, size: int | None) -> Iterator[slice]:
    """Consecutive slices of at most ``size`` rows covering ``range(rows)`` (one slice when ``size`` is None)."""
    size = size or rows
    for start in range(0, rows, size):
        yield slice(start, min(start + size, rows))


def optimizer_step_rows(rows: int, config: UpdateConfig, device: torch.device, *, in_order: bool) -> Iterator[Tensor]:
    """The rows of each optimizer step on a rollout batch of ``rows`` sequences: ``config.epochs`` passes, each a
    fresh permutation (``torch.randperm``) cut into mini-batches; ``in_order``: the rows in their original order
    (a reused statistics forward covers them so)."""
    for _ in range(config.epochs):
        order = torch.arange(rows, device=device) if in_order else torch.randperm(rows, device=device)
        for mini in row_slices(rows, config.mini_batch_size):
            yield order[mini]


def updates_per_batch(rows: int, config: UpdateConfig) -> int:
    """Optimizer steps per rollout batch of ``rows`` sequences: epochs x mini-batches."""
    return config.epochs * math.ceil(rows / (config.mini_batch_size or rows))


def single_update(rows: int, config: UpdateConfig) -> bool:
    """True when the batch gets exactly one update on all its rows in one forward (epochs 1, one mini- and
    micro-batch): then the old log-probs equal the update's own and one forward can serve both."""
    return updates_per_batch(rows, config) == 1 and (config.micro_batch_size or rows) >= rows


def lr_multiplier(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step ``step``: linear warm-up, then constant/linear/cosine decay."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor


def schedule_horizon(stepping_batches: float, updates_per_batch: int, max_steps: int) -> int:
    """Optimizer steps the LR schedule decays over: ``updates_per_batch`` per rollout batch, at most ``max_steps``.

    Args:
        stepping_batches: Lightning's ``trainer.estimated_stepping_batches``: the run's training batches, already
            capped by ``max_steps``.
        updates_per_batch: optimizer steps per rollout batch (:func:`updates_per_batch`).
        max_steps: ``trainer.max_steps`` (-1 = none). Under manual optimization it counts optimizer steps, not
            batches, so the batches capped by it, times ``updates_per_batch``, would be too long a schedule;
            capping the product again is exact: ``min(batches * U, max_steps)``.
    """
    steps = stepping_batches * updates_per_batch
    return max(1, int(min(steps, max_steps) if max_steps >= 0 else steps))


def build_optimizer(params: Iterable[torch.nn.Parameter], config: OptimConfig, total_steps: int) -> dict[str, Any]:
    """The optimizer (AdamW, or ``config.optimizer``) and its per-step LambdaLR schedule, as Lightning expects them.

    Args:
        params: the trainable parameters.
        config: optimizer settings.
        total_steps: optimizer steps of the whole run (the decay horizon).
    """
    params = list(params)
    if config.optimizer is not None:
        optimizer = config.optimizer(params)
    else:
        optimizer = torch.optim.AdamW(params, lr=config.adamw_lr, weight_decay=config.adamw_weight_decay)
    schedule = lr_multiplier(config.lr_schedule, config.warmup_steps, max(1, total_steps))
    return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)}


def clip_grad_norm_and_agree(
    params: list[torch.nn.Parameter], max_norm: float | None, finite_loss: bool
) -> tuple[torch.Tensor, str | None]:
    """Clip the global gradient norm and decide, identically on every rank, whether the step may be taken.

    Args:
        params: parameters that have gradients (DTensors under FSDP2: the norm is then the global one).
        max_norm: clip threshold; None = no clipping (the norm is still computed).
        finite_loss: whether this rank's losses of the step were all finite.

    Returns:
        ``(norm, problem)``: the pre-clip global norm (float32, CPU) and None when the step may be taken, else
        what was not finite on some rank (``"loss"`` or ``"gradient norm"``).
    """
    device = params[0].device if params else torch.device("cpu")
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm or float("inf")) if params else torch.zeros(())
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    # The loss check is local: every rank must take the same decision, so agree on it.
    bad_losses = float(all_reduce_sum(torch.tensor([0.0 if finite_loss else 1.0], device=device)))
    problem = "loss" if bad_losses else (None if bool(torch.isfinite(norm)) else "gradient norm")
    return norm.detach().float().cpu(), problem

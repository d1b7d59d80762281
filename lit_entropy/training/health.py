"""The policy's health after every update: non-finite parameters stop the run naming the update and the
learning rate; weights that explode and a policy collapsed to uniform sampling are warned about once.

Without it, ``--model.optim.lr 1e30`` stopped one batch later at sampling ("rollout engine failed: ...
NaN/+inf scores"), which never named the update, and ``lr 1e4`` turned the policy uniform (entropy ln V)
without a word.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lit_entropy.reporting.steps import trained_batches

__all__ = [
    "EXPLODED_RATIO",
    "UNIFORM_FRACTION",
    "PolicyDiverged",
    "PolicyHealth",
    "explain_sampling_failure",
    "sampling_failures",
    "nonfinite_parameter",
]

#: Parameter norm over its value at the start of training beyond which the weights count as exploded.
EXPLODED_RATIO = 10.0
#: Mean token entropy over its maximum ln V from which the policy counts as sampling uniformly.
UNIFORM_FRACTION = 0.98


class PolicyDiverged(RuntimeError):
    """An update made the policy's parameters non-finite; the command line prints it as one line."""


def nonfinite_parameter(module: torch.nn.Module) -> str | None:
    """The name of the first parameter of ``module`` holding a NaN or inf (this rank's shard), else None."""
    for name, param in module.named_parameters():
        local = param.to_local() if hasattr(param, "to_local") else param
        if not bool(torch.isfinite(local.detach()).all()):
            return name
    return None


def _norm(module: torch.nn.Module, trainer: Trainer) -> float:
    """The L2 norm of every parameter of ``module`` (shards summed over ranks)."""
    squares = [
        # float64: the squares of exploded (finite) float32 weights overflow float32
        (p.to_local() if hasattr(p, "to_local") else p).detach().double().pow(2).sum()
        for p in module.parameters()
    ]
    if not squares:
        return 0.0
    total = torch.stack(squares).sum()
    if trainer.world_size > 1:
        total = trainer.strategy.reduce(total, reduce_op="sum")
    return float(total.sqrt())


def _step(trainer: Trainer) -> int:
    """The step of the batch that just ended, as the step lines and TensorBoard number it."""
    return trained_batches(trainer) - 1


def _learning_rate(trainer: Trainer) -> str:
    optimizers = trainer.optimizers
    return f"{optimizers[0].param_groups[0]['lr']:g}" if optimizers else "?"


class PolicyHealth(Callback):
    """After each training batch: stop on non-finite parameters, warn once about exploded weights or a uniform policy.

    The uniform-policy warning needs the first trained batch's entropy below ``UNIFORM_FRACTION`` of ln V:
    a model that samples uniformly from the start (random initialisation) was not destroyed by the updates.

    The parameter norm costs one pass over the weights per batch (an all-reduce of one number under FSDP2).
    """

    def __init__(self) -> None:
        self.start_norm: float | None = None
        self.last_norm: float | None = None
        self.warned: set[str] = set()
        self._resumed_start: float | None = None
        # Mean token entropy of the first trained batch over ln V: a policy that already sampled (near)
        # uniformly before any update (a random-init model) was not collapsed by the updates.
        self.start_entropy_fraction: float | None = None

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start_norm = self._resumed_start or _norm(_policy(pl_module), trainer)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        policy = _policy(pl_module)
        step = _step(trainer)
        norm = self.last_norm = _norm(policy, trainer)
        if not math.isfinite(norm):
            name = nonfinite_parameter(policy) or "a parameter"
            raise PolicyDiverged(
                f"the update of step {step} made the policy's parameters non-finite ({name}): the "
                f"learning rate is too large (model.optim.lr={_learning_rate(trainer)}); lower it, or "
                "model.optim.max_grad_norm"
            )
        if self.start_norm and norm > EXPLODED_RATIO * self.start_norm and "exploded" not in self.warned:
            self.warned.add("exploded")
            rank_zero_warn(
                f"lit_entropy: the policy's weights exploded: parameter norm {norm:.3g} after the update of step "
                f"{step}, "
                f"{norm / self.start_norm:.3g}x its value at the start; the learning rate is likely too large "
                f"(model.optim.lr={_learning_rate(trainer)})"
            )
        entropy = trainer.callback_metrics.get("train/entropy/mean")
        vocab = getattr(getattr(policy, "config", None), "vocab_size", None)
        if entropy is not None and vocab and "uniform" not in self.warned:
            maximum = math.log(vocab)
            fraction = float(entropy) / maximum
            if self.start_entropy_fraction is None:
                self.start_entropy_fraction = fraction
            if fraction >= UNIFORM_FRACTION and self.start_entropy_fraction < UNIFORM_FRACTION:
                self.warned.add("uniform")
                rank_zero_warn(
                    f"lit_entropy: the policy samples uniformly: mean token entropy {float(entropy):.3f} at its "
                    f"maximum ln V = {maximum:.3f} (vocabulary {vocab}) at step {step}; the updates "
                    f"destroyed the policy (model.optim.lr={_learning_rate(trainer)})"
                )

    def state_dict(self) -> dict[str, Any]:
        return {
            "start_norm": self.start_norm,
            "warned": sorted(self.warned),
            "start_entropy_fraction": self.start_entropy_fraction,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.warned = set(state_dict.get("warned", []))
        self._resumed_start = state_dict.get("start_norm")
        self.start_entropy_fraction = state_dict.get("start_entropy_fraction")


def explain_sampling_failure(trainer: Trainer | None, error: BaseException) -> str | None:
    """Why sampling failed, when the cause is the policy's weights (an exploded update made its scores
    non-finite); None for any other failure."""
    health = next((cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, PolicyHealth)), None)
    if (
        trainer is None
        or health is None
        or "exploded" not in health.warned
        or not health.start_norm
        or health.last_norm is None
    ):
        return None
    ratio = health.last_norm / health.start_norm
    return (
        f"sampling failed ({type(error).__name__}) because the policy's weights exploded: parameter norm "
        f"{health.last_norm:.3g}, {ratio:.3g}x its value at the start, after the update of step "
        f"{_step(trainer)}, so its scores are not finite; the learning rate is too large "
        f"(model.optim.lr={_learning_rate(trainer)})"
    )


@contextmanager
def sampling_failures(trainer: Trainer | None, engine: Any) -> Iterator[None]:
    """Within the block (one rollout), an exception is re-raised as :class:`PolicyDiverged` when the policy's weights
    exploded (:func:`explain_sampling_failure`), else as a RuntimeError naming ``engine``'s ``generate``."""
    try:
        yield
    except Exception as error:
        cause = explain_sampling_failure(trainer, error)  # exploded weights, not the engine
        if cause is not None:
            raise PolicyDiverged(cause) from error
        raise RuntimeError(
            f"rollout engine failed: {type(engine).__name__}.generate raised {type(error).__name__}: {error}"
        ) from error


def _policy(pl_module: LightningModule) -> torch.nn.Module:
    return getattr(pl_module, "policy", None) or pl_module

"""The per-row tensors of a rollout batch, declared once as typed dataclass fields.

Every tensor that travels with the rows of a rollout batch -- per token ``[N, T]`` (``N`` = prompts x samples,
``T`` = response length) or per row ``[N]`` -- is a field of one of four groups below, written as an ordinary
annotated attribute with its docstring, so a reader, an IDE and a type checker see ``rows.advantages`` and
``rows.loss_mask`` with their types:

- :class:`PolicyStatistics`: what the rollout policy's no-grad pass computes at each sampled token;
- :class:`RowScores`: the reward of each completion and the advantage of each token;
- :class:`PassStatistics`: what the other passes of the statistics pass compute (reference, critic, kept set);
- :class:`UpdateInputs`: what the estimator, the callbacks and the rollout correction add for the update.

The classes that carry them are these groups combined: :class:`~lit_entropy.step.RolloutStatistics` (the statistics
pass: policy + pass statistics), :class:`~lit_entropy.step.Experience` (:class:`RolloutRows`, all four: what the
update epochs read) and :class:`~lit_entropy.protocol.TokenMaskContext` (policy statistics + scores, each optional:
what callbacks read). ``PolicyStatistics`` and ``RowScores`` are generic in :data:`Filled`: the
holders that always fill them take ``Tensor``, the callback context ``Tensor | None``. :class:`RowTensors` derives
selecting rows for a mini-batch, concatenating micro-batches, detaching and building the callback context from the
fields' :func:`row_field` metadata, so a new per-token quantity is one more field in its group plus the code that
computes it: no list of names elsewhere can leave it behind, so a full-batch tensor can never reach a mini-batch.

This module imports only torch (like :mod:`lit_entropy.protocol`, which uses it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor

__all__ = [
    "ROLLOUT_FIELDS",
    "Filled",
    "PassStatistics",
    "PolicyStatistics",
    "ReadOnlyRows",
    "RolloutField",
    "RolloutRows",
    "RowTensors",
    "RowScores",
    "UpdateInputs",
    "row_field",
    "rollout_field",
]

_ROW = "lit_entropy.row"
"""The ``dataclasses.field`` metadata key that marks a per-row tensor (its value: the :class:`RolloutField`)."""

Filled = TypeVar("Filled", bound="Tensor | None")
"""``Tensor`` in a holder that always fills the field, ``Tensor | None`` in the callback context."""

R = TypeVar("R", bound="RowTensors")


@dataclass(frozen=True)
class RolloutField:
    """How one per-row tensor travels with the rows of a rollout batch (read from its field's metadata).

    Attributes:
        name: the attribute name on every class that holds it.
        per_token: ``[N, T]`` when True, one value per row ``[N]`` when False.
        required: never None in :class:`~lit_entropy.step.Experience` and
            :class:`~lit_entropy.step.RolloutStatistics` (a TypeError names it); the callback context treats every
            field as optional (a module fills what it can, see ``token_mask_fields()``).
    """

    name: str
    per_token: bool = True
    required: bool = False


def row_field(*, per_token: bool = True, required: bool = False) -> Any:
    """A dataclass field (default None) that is a per-row tensor: :class:`RowTensors` slices, concatenates,
    detaches and checks it. ``required``: see :attr:`RolloutField.required`."""
    return dataclasses.field(default=None, metadata={_ROW: (per_token, required)})


class RowTensors:
    """Base of the dataclasses that carry per-row tensors; its methods derive from the :func:`row_field` fields.

    A holder whose ``all_optional`` is False refuses None for a required field at construction.
    """

    all_optional: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if self.all_optional:
            return
        missing = [f.name for f in self.row_fields() if f.required and getattr(self, f.name) is None]
        if missing:
            raise TypeError(f"{type(self).__name__} needs the row tensors {missing} (got None)")

    @classmethod
    def row_fields(cls) -> tuple[RolloutField, ...]:
        """The per-row tensors this class holds, in field order."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]  # every holder is a dataclass
        return tuple(RolloutField(f.name, *f.metadata[_ROW]) for f in fields if _ROW in f.metadata)

    def row_tensors(self) -> dict[str, Tensor | None]:
        """``{name: tensor or None}`` of every held field."""
        return {f.name: getattr(self, f.name) for f in self.row_fields()}

    def with_row_tensors(self: R, tensors: dict[str, Tensor | None], **others: Any) -> R:
        """A shallow copy with ``tensors`` (held fields) and ``others`` (any other attributes) replaced."""
        out = copy.copy(self)
        for name, value in {**tensors, **others}.items():
            object.__setattr__(out, name, value)  # frozen holders too: this is construction of ``out``
        return out

    @classmethod
    def from_row_tensors(cls: type[R], tensors: dict[str, Tensor | None], **others: Any) -> R:
        """Build by keyword from ``others`` (the class's own fields) and the held fields found in ``tensors``."""
        return cls(**others, **{f.name: tensors.get(f.name) for f in cls.row_fields()})

    def rows(self: R, index: Tensor | slice) -> R:
        """The selected rows of every held tensor (``index``: a row index tensor or a slice)."""
        return self.with_row_tensors({k: None if t is None else t[index] for k, t in self.row_tensors().items()})

    def narrow_columns(self: R, width: int) -> R:
        """The first ``width`` token columns of every per-token tensor (per-row tensors unchanged)."""
        per_token = {f.name for f in self.row_fields() if f.per_token}
        return self.with_row_tensors(
            {k: t[:, :width] for k, t in self.row_tensors().items() if t is not None and k in per_token}
        )

    def widen_columns(self: R, width: int) -> R:
        """Every per-token tensor right-padded with zeros (False) to ``width`` token columns."""
        per_token = {f.name for f in self.row_fields() if f.per_token}
        return self.with_row_tensors(
            {
                k: torch.nn.functional.pad(t, (0, width - t.shape[1]))
                for k, t in self.row_tensors().items()
                if t is not None and k in per_token
            }
        )

    def detach(self: R) -> R:
        """A copy whose held tensors are detached from any graph."""
        return self.with_row_tensors({k: None if t is None else t.detach() for k, t in self.row_tensors().items()})

    @classmethod
    def cat(cls: type[R], parts: Sequence[R]) -> R:
        """The parts' rows concatenated (micro-batches in order); other attributes are the last part's."""
        tensors: dict[str, Tensor | None] = {}
        for name in (f.name for f in cls.row_fields()):
            values = [getattr(p, name) for p in parts]
            if any(v is None for v in values) and any(v is not None for v in values):
                raise ValueError(f"{cls.__name__}.cat: {name} is None in some parts and set in others")
            tensors[name] = None if values[0] is None else torch.cat([v for v in values if v is not None])
        return parts[-1].with_row_tensors(tensors)

    def check_row_shapes(self, mask: Tensor) -> None:
        """Raise a ValueError naming a held tensor whose shape is not ``mask``'s (per token) or ``[N]`` (per row)."""
        for declared in self.row_fields():
            value = getattr(self, declared.name)
            want = tuple(mask.shape) if declared.per_token else tuple(mask.shape[:1])
            if value is not None and tuple(value.shape) != want:
                raise ValueError(
                    f"{type(self).__name__}.{declared.name} has shape {tuple(value.shape)}, expected {want} "
                    f"({'the mask shape' if declared.per_token else 'one value per row'})"
                )


@dataclass(kw_only=True)
class PolicyStatistics(RowTensors, Generic[Filled]):
    """What the rollout policy's no-grad pass computes at each sampled token, ``[N, T]``."""

    old_logprobs: Filled = row_field(required=True)
    """Log-probability of the sampled token under the rollout policy."""
    entropy: Filled = row_field(required=True)
    """Entropy in nats of the rollout policy at each position."""
    discriminator: Filled = row_field(required=True)
    """``S = p (H + log p)`` of the sampled token, detached."""
    policy_average: Tensor | None = row_field()
    """``E_p[S] = H sum p^2 + sum p^2 log p``; None unless a callback asks for it."""


@dataclass(kw_only=True)
class RowScores(RowTensors, Generic[Filled]):
    """The reward of each completion and the advantage of each token."""

    rewards: Filled = row_field(per_token=False, required=True)
    """``[N]`` float, one reward per completion (as scored)."""
    advantages: Filled = row_field(required=True)
    """``[N, T]`` float32, the advantage of each token (GRPO: per sequence, broadcast)."""


@dataclass(kw_only=True)
class PassStatistics(RowTensors):
    """What the statistics pass computes besides the policy's own statistics, ``[N, T]``; each None when off."""

    ref_logprobs: Tensor | None = row_field()
    """Reference-model log-probs (KL term); None without one."""
    old_values: Tensor | None = row_field()
    """Critic values at rollout time (PPO); None otherwise."""
    kept_log_mass: Tensor | None = row_field()
    """Log of the trainer's probability mass in the top-k / top-p kept set; None unless
    ``model.loss.rollout_correction.kept_set_logprobs`` and a filter are on."""


@dataclass(kw_only=True)
class UpdateInputs(RowTensors):
    """What the advantage estimator, the callbacks and the rollout correction add for the update, ``[N, T]``; each
    None when off, but the loss mask, which every update reads."""

    returns: Tensor | None = row_field()
    """GAE returns (PPO); None otherwise."""
    loss_mask: Tensor = row_field(required=True)
    """bool, the response mask AND every callback's keep mask (set by ``build_experience``)."""
    penalty: Tensor | None = row_field()
    """Coefficients of ``|log p - log p_old|`` from penalty callbacks, or None."""
    rollout_gap: Tensor | None = row_field()
    """Trainer minus rollout-engine log-prob of each sampled token; None unless the engine reports log-probs."""
    rollout_weights: Tensor | None = row_field()
    """Rollout-correction weights of each token's policy-loss term; None unless
    ``model.loss.rollout_correction`` is on."""


@dataclass(kw_only=True)
class RolloutRows(UpdateInputs, PassStatistics, RowScores[Tensor], PolicyStatistics[Tensor]):
    """Every per-row tensor of a rollout batch (the base of :class:`~lit_entropy.step.Experience`)."""


@dataclass(frozen=True)
class ReadOnlyRows:
    """Base of a frozen holder (:class:`~lit_entropy.protocol.TokenMaskContext`): ``dataclasses`` lets a frozen
    class take the (mutable) field groups above only beside a frozen base."""


ROLLOUT_FIELDS: tuple[RolloutField, ...] = RolloutRows.row_fields()
"""Every per-row tensor of a rollout batch, in :class:`RolloutRows`' field order."""


def rollout_field(name: str) -> RolloutField:
    """The declared field called ``name`` (KeyError naming the declared ones otherwise)."""
    for declared in ROLLOUT_FIELDS:
        if declared.name == name:
            return declared
    raise KeyError(f"{name!r} is not in lit_entropy.tokens.ROLLOUT_FIELDS ({[f.name for f in ROLLOUT_FIELDS]})")

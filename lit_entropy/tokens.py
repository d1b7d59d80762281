"""The per-row tensors of a rollout batch, declared once.

:data:`ROLLOUT_FIELDS` names every tensor that travels with the rows of a rollout batch: per token ``[N, T]``
(``N`` = prompts x samples, ``T`` = response length) or per row ``[N]``. The classes that carry them --
:class:`~lit_entropy.step.RolloutStatistics` (the statistics pass), :class:`~lit_entropy.step.Experience` (what
the update epochs read) and :class:`~lit_entropy.protocol.TokenMaskContext` (what callbacks read) -- derive
their fields from it through :class:`RowTensors`, and so do selecting rows for a mini-batch, concatenating
micro-batches, detaching and building the callback context. A new per-token quantity is one more
:class:`RolloutField` here plus the code that computes it: no list of names elsewhere can leave it behind, so a
full-batch tensor can never reach a mini-batch.

This module imports only torch (like :mod:`lit_entropy.protocol`, which uses it).
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch
from torch import Tensor

__all__ = ["ROLLOUT_FIELDS", "RolloutField", "RowTensors", "rollout_field"]


@dataclass(frozen=True)
class RolloutField:
    """One tensor that travels with the rows of a rollout batch.

    Attributes:
        name: the attribute name on every class that holds it.
        doc: what it holds (dtype, units, when it is None).
        per_token: ``[N, T]`` when True, one value per row ``[N]`` when False.
        required: always filled in an :class:`~lit_entropy.step.Experience` (no default there); the callback
            context treats every field as optional (a module fills what it can, see ``token_mask_fields()``).
        statistics: computed by the statistics pass (held by :class:`~lit_entropy.step.RolloutStatistics`).
        context: offered to callbacks in :class:`~lit_entropy.protocol.TokenMaskContext` (False for what the
            callbacks themselves produce, and for what exists only in some configurations).
    """

    name: str
    doc: str
    per_token: bool = True
    required: bool = False
    statistics: bool = False
    context: bool = True


ROLLOUT_FIELDS: tuple[RolloutField, ...] = (
    RolloutField("rewards", "float, one reward per completion (as scored)", per_token=False, required=True),
    RolloutField("advantages", "float32, the advantage of each token (GRPO: per sequence, broadcast)", required=True),
    RolloutField(
        "old_logprobs", "log-probability of the sampled token under the rollout policy", required=True, statistics=True
    ),
    RolloutField("entropy", "entropy in nats of the rollout policy at each position", required=True, statistics=True),
    RolloutField(
        "discriminator", "``S = p (H + log p)`` of the sampled token, detached", required=True, statistics=True
    ),
    RolloutField("policy_average", "``E_p[S] = H sum p^2 + sum p^2 log p``; None unless asked for", statistics=True),
    RolloutField(
        "ref_logprobs", "reference-model log-probs (KL term); None without one", statistics=True, context=False
    ),
    RolloutField("old_values", "critic values at rollout time (PPO); None otherwise", statistics=True, context=False),
    RolloutField("returns", "GAE returns (PPO); None otherwise", context=False),
    RolloutField("loss_mask", "bool, the response mask AND every callback's keep mask", context=False),
    RolloutField("penalty", "coefficients of ``|log p - log p_old|`` from penalty callbacks, or None", context=False),
    RolloutField(
        "rollout_gap",
        "trainer minus rollout-engine log-prob of each sampled token; None unless the engine reports log-probs",
        context=False,
    ),
    RolloutField(
        "kept_log_mass",
        "log of the trainer's probability mass in the top-k / top-p kept set; None unless "
        "``model.loss.rollout_correction.kept_set_logprobs`` and a filter are on",
        statistics=True,
        context=False,
    ),
    RolloutField(
        "rollout_weights",
        "rollout-correction weights of each token's policy-loss term; None unless "
        "``model.loss.rollout_correction`` is on",
        context=False,
    ),
)
"""Every per-row tensor of a rollout batch, in the order the classes list them."""


def rollout_field(name: str) -> RolloutField:
    """The declared field called ``name`` (KeyError naming the declared ones otherwise)."""
    for declared in ROLLOUT_FIELDS:
        if declared.name == name:
            return declared
    raise KeyError(f"{name!r} is not in lit_entropy.tokens.ROLLOUT_FIELDS ({[f.name for f in ROLLOUT_FIELDS]})")


R = TypeVar("R", bound="RowTensors")


class RowTensors:
    """Mixin of the dataclasses that carry some of :data:`ROLLOUT_FIELDS`; its methods derive from the declaration.

    A subclass says which fields it holds (``class C(RowTensors, holds=lambda f: f.statistics)``) before
    ``@dataclass(kw_only=True)`` runs: each held field becomes a keyword field (no default when ``required`` and
    ``all_optional`` is False, else None). The methods read the declaration when they run, so a field declared
    after a class was made (a test's monkeypatch) is sliced, concatenated, detached and offered to callbacks as
    an instance attribute.
    """

    _holds: ClassVar[Callable[[RolloutField], bool]]

    def __init_subclass__(
        cls, holds: Callable[[RolloutField], bool] | None = None, all_optional: bool = False, **kwargs: Any
    ) -> None:
        super().__init_subclass__(**kwargs)
        if holds is None:  # a subclass of a holder: inherits its fields
            return
        cls._holds = staticmethod(holds)
        annotations = cls.__dict__.get("__annotations__", {})
        for declared in ROLLOUT_FIELDS:
            if holds(declared) and declared.name not in annotations:
                annotations[declared.name] = "Tensor | None" if all_optional or not declared.required else "Tensor"
                if all_optional or not declared.required:
                    setattr(cls, declared.name, None)
        cls.__annotations__ = annotations
        # help() and the API docs list the held fields with the class's own attributes.
        doc = (cls.__doc__ or "").rstrip()
        doc += "" if "Attributes:" in doc else "\n\n    Attributes:"
        held = "".join(f"\n        {f.name}: {_shape(f)} {f.doc}." for f in ROLLOUT_FIELDS if holds(f))
        cls.__doc__ = f"{doc}{held}\n"

    @classmethod
    def row_fields(cls) -> tuple[RolloutField, ...]:
        """The declared fields this class holds, read from :data:`ROLLOUT_FIELDS` now."""
        return tuple(f for f in ROLLOUT_FIELDS if cls._holds(f))

    def row_tensors(self) -> dict[str, Tensor | None]:
        """``{name: tensor or None}`` of every held field."""
        return {f.name: getattr(self, f.name, None) for f in self.row_fields()}

    def with_row_tensors(self: R, tensors: dict[str, Tensor | None], **others: Any) -> R:
        """A shallow copy with ``tensors`` (held fields) and ``others`` (any other attributes) replaced."""
        out = copy.copy(self)
        for name, value in {**tensors, **others}.items():
            object.__setattr__(out, name, value)  # frozen holders too: this is construction of ``out``
        return out

    @classmethod
    def from_row_tensors(cls: type[R], tensors: dict[str, Tensor | None], **others: Any) -> R:
        """Build by keyword from ``others`` (the class's own fields) and the held fields found in ``tensors``."""
        init = {f.name for f in dataclasses.fields(cls) if f.init}  # type: ignore[arg-type]
        held = {f.name: tensors.get(f.name) for f in cls.row_fields()}
        out = cls(**others, **{k: v for k, v in held.items() if k in init})
        late = {k: v for k, v in held.items() if k not in init}  # declared after the class was made
        return out.with_row_tensors(late) if late else out

    def rows(self: R, index: Tensor | slice) -> R:
        """The selected rows of every held tensor (``index``: a row index tensor or a slice)."""
        return self.with_row_tensors({k: None if t is None else t[index] for k, t in self.row_tensors().items()})

    def narrow_columns(self: R, width: int) -> R:
        """The first ``width`` token columns of every per-token tensor (per-row tensors unchanged)."""
        per_token = {f.name for f in ROLLOUT_FIELDS if f.per_token}
        return self.with_row_tensors(
            {k: t[:, :width] for k, t in self.row_tensors().items() if t is not None and k in per_token}
        )

    def widen_columns(self: R, width: int) -> R:
        """Every per-token tensor right-padded with zeros (False) to ``width`` token columns."""
        per_token = {f.name for f in ROLLOUT_FIELDS if f.per_token}
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
            values = [getattr(p, name, None) for p in parts]
            if any(v is None for v in values) and any(v is not None for v in values):
                raise ValueError(f"{cls.__name__}.cat: {name} is None in some parts and set in others")
            tensors[name] = None if values[0] is None else torch.cat(values)
        return parts[-1].with_row_tensors(tensors)

    def check_row_shapes(self, mask: Tensor) -> None:
        """Raise a ValueError naming a held tensor whose shape is not ``mask``'s (per token) or ``[N]`` (per row)."""
        for declared in self.row_fields():
            value = getattr(self, declared.name, None)
            want = tuple(mask.shape) if declared.per_token else tuple(mask.shape[:1])
            if value is not None and tuple(value.shape) != want:
                raise ValueError(
                    f"{type(self).__name__}.{declared.name} has shape {tuple(value.shape)}, expected {want} "
                    f"({'the mask shape' if declared.per_token else 'one value per row'})"
                )


def _shape(declared: RolloutField) -> str:
    return "``[N, T]``" if declared.per_token else "``[N]``"

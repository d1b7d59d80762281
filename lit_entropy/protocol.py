"""The token-mask protocol between an RL LightningModule and mask-providing callbacks.

A Lightning callback cannot change a loss, so the module *asks* its callbacks for masks. The
contract, in the order a training step runs:

1. The module samples a rollout batch and runs its no-grad pass (old log-probs, entropy, the
   entropy discriminator ``S`` and, when a provider needs it, the policy average ``E_p[S]``).
2. It builds one :class:`TokenMaskContext` for its local share of the batch and calls
   :func:`collect_keep_mask` **on every rank** (providers may all-reduce global statistics).
3. It multiplies its loss mask by the returned keep mask for all update epochs of that batch: a
   masked token leaves the policy loss *and* the token-count denominator.

The module declares what it can fill in with ``token_mask_fields()`` and which requests it makes
per rollout batch with ``token_requests()`` (see :class:`TokenMaskingModule`); providers declare what
they need in ``required_fields`` and check both at ``setup``, so a provider whose module never asks
for it fails before training instead of silently doing nothing. Besides keep masks, a module may ask
for per-token penalties (:class:`TokenPenaltyProvider`, KL-Cov) and per-batch loss coefficients
(:class:`LossCoefficientProvider`, an adaptive entropy bonus). This module imports only torch (and
:mod:`lit_entropy.tokens`, where the context's fields are declared), so a user's own LightningModule can implement
the protocol without pulling in transformers or vLLM.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch
from torch import Tensor

from lit_entropy.tokens import PolicyStatistics, ReadOnlyRows, RowScores, RowTensors

__all__ = [
    "TOKEN_REQUESTS",
    "LossCoefficientProvider",
    "TokenMaskContext",
    "TokenMaskProvider",
    "TokenMaskObserver",
    "TokenMaskingModule",
    "TokenAdvantageProvider",
    "TokenPenaltyProvider",
    "check_token_masking_module",
    "collect_keep_mask",
    "collect_token_advantages",
    "collect_loss_coefficients",
    "collect_token_penalty",
    "required_token_mask_fields",
    "loss_coefficient_providers",
    "module_token_requests",
    "rollout_group_size",
    "token_advantage_providers",
    "token_mask_observers",
    "token_mask_providers",
    "token_penalty_providers",
    "updates_per_rollout_batch",
]


TOKEN_REQUESTS: tuple[str, ...] = ("keep_mask", "token_penalty", "loss_coefficients", "advantages")
"""What a module can ask its callbacks for once per rollout batch: :func:`collect_keep_mask`,
:func:`collect_token_penalty`, :func:`collect_loss_coefficients`, :func:`collect_token_advantages`."""


@dataclass(frozen=True, kw_only=True)
class TokenMaskContext(  # type: ignore[misc]  # mypy refuses what ReadOnlyRows lets dataclasses do
    ReadOnlyRows, RowScores[Tensor | None], PolicyStatistics[Tensor | None]
):
    """Per-token statistics of one rollout batch (this rank's share), ``[B, T]`` (``rewards``: ``[B]``); by keyword;
    read-only.

    Its fields besides ``mask`` are the rewards, the advantages and the rollout policy's statistics
    (:class:`~lit_entropy.tokens.RowScores`, :class:`~lit_entropy.tokens.PolicyStatistics`), each None
    unless the module filled it (``policy_average`` only when a provider asks for it).

    Attributes:
        mask: bool, True on real response tokens.
    """

    mask: Tensor
    all_optional: ClassVar[bool] = True

    def __post_init__(self) -> None:
        if self.mask.dtype != torch.bool:
            raise ValueError(f"TokenMaskContext.mask must be a bool tensor, got {self.mask.dtype}")
        self.check_row_shapes(self.mask)

    @classmethod
    def of(cls, source: RowTensors, mask: Tensor) -> TokenMaskContext:
        """The context of ``source``'s rows: every context field it holds, and ``mask``."""
        context = cls.from_row_tensors(source.row_tensors(), mask=mask)
        context.check_row_shapes(mask)  # fields declared after the class was made are checked here
        return context

    @classmethod
    def field_names(cls) -> frozenset[str]:
        """Every field a context can hold: what a module that fills them all returns from ``token_mask_fields()``."""
        return frozenset({"mask", *(f.name for f in cls.row_fields())})

    def require(self, name: str) -> Tensor:
        """The field ``name``, which a callback that reads it needs filled; a ValueError naming it when the module
        left it None (``name`` is not among the module's ``token_mask_fields()``)."""
        value: Tensor | None = getattr(self, name)
        if value is None:
            raise ValueError(
                f"TokenMaskContext.{name} is not filled: the module's token_mask_fields() does not include {name!r}, "
                "which this callback reads"
            )
        return value

    def present_fields(self) -> frozenset[str]:
        """Names of the fields that are filled in (not None)."""
        return frozenset({"mask", *(k for k, v in self.row_tensors().items() if v is not None)})


@runtime_checkable
class TokenMaskProvider(Protocol):
    """A callback that contributes a keep mask (True = the token stays in the loss)."""

    required_fields: frozenset[str]
    """The :class:`TokenMaskContext` fields this provider reads."""

    def keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Return a bool ``[B, T]`` keep mask, a subset of ``context.mask``. Called on every rank."""
        ...


@runtime_checkable
class TokenPenaltyProvider(Protocol):
    """A callback that adds a per-token penalty ``coef * |log p - log p_old|`` to the policy loss (e.g. KL-Cov)."""

    required_fields: frozenset[str]

    def token_penalty(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Return a float ``[B, T]`` coefficient per token (0 = no penalty). Called on every rank."""
        ...


@runtime_checkable
class LossCoefficientProvider(Protocol):
    """A callback that sets loss coefficients for one rollout batch (e.g. an adaptive entropy bonus)."""

    required_fields: frozenset[str]

    def loss_coefficients(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> dict[str, float]:
        """Return ``{name: value}`` for names the module lists in ``loss_coefficients()``. Called on every rank."""
        ...


@runtime_checkable
class TokenAdvantageProvider(Protocol):
    """A callback that replaces the advantages of one rollout batch (per-token weights, switching, shaping)."""

    required_fields: frozenset[str]

    def token_advantages(self, trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
        """Return float ``[B, T]`` advantages for ``context``'s tokens (read ``context.advantages``: the estimator's,
        or the previous provider's). Called on every rank."""
        ...


@runtime_checkable
class TokenMaskObserver(Protocol):
    """A callback that reads the batch together with the final keep mask (e.g. a diagnostic)."""

    required_fields: frozenset[str]

    def observe_keep_mask(self, trainer: Any, pl_module: Any, context: TokenMaskContext, keep: Tensor) -> None:
        """See the context and the AND of every provider's mask. Called on every rank."""
        ...


@runtime_checkable
class TokenMaskingModule(Protocol):
    """A LightningModule that asks :class:`TokenMaskProvider` callbacks for keep masks."""

    def token_mask_fields(self) -> frozenset[str]:
        """The :class:`TokenMaskContext` fields this module can fill in (``mask`` and ``advantages`` always)."""
        ...

    # Optional, read with getattr: token_requests() -> frozenset of TOKEN_REQUESTS the module makes per rollout
    # batch (default {"keep_mask"}); loss_coefficients() -> {name: current value} it lets callbacks set;
    # updates_per_rollout_batch() -> optimizer steps per rollout batch (default 1); group_size() -> samples per
    # prompt, rows grouped by prompt in consecutive groups on every rank (default: unknown).


def module_token_requests(pl_module: Any) -> frozenset[str]:
    """The requests ``pl_module`` makes per rollout batch (``{"keep_mask"}`` when it does not say)."""
    requests = getattr(pl_module, "token_requests", None)
    return frozenset(requests()) if callable(requests) else frozenset({"keep_mask"})


def updates_per_rollout_batch(pl_module: Any) -> int:
    """Optimizer steps ``pl_module`` takes per rollout batch (1 when it does not say)."""
    updates = getattr(pl_module, "updates_per_rollout_batch", None)
    return int(updates()) if callable(updates) else 1


def rollout_group_size(pl_module: Any) -> int | None:
    """Samples per prompt of ``pl_module``'s rollout batches (rows in consecutive groups); None if it does not say."""
    size = getattr(pl_module, "group_size", None)
    return int(size()) if callable(size) else None


def check_token_masking_module(
    pl_module: Any, required_fields: frozenset[str], who: str, request: str = "keep_mask"
) -> None:
    """Raise a TypeError naming what ``pl_module`` lacks for a provider ``who`` that reads ``required_fields``.

    Providers call it at ``setup``, so a module that cannot serve them, or never asks for ``request``
    (one of :data:`TOKEN_REQUESTS`), fails before training starts.
    """
    name = type(pl_module).__name__
    fields_fn = getattr(pl_module, "token_mask_fields", None)
    if not callable(fields_fn):
        raise TypeError(
            f"{who} needs {name} to implement lit_entropy.protocol.TokenMaskingModule: a method "
            "token_mask_fields() and a call to lit_entropy.protocol.collect_keep_mask(...) (and "
            f"collect_token_penalty(...)) once per rollout batch; {name} has no token_mask_fields()"
        )
    requests = module_token_requests(pl_module)
    if request not in requests:
        raise TypeError(
            f"{who} provides {request!r} but {name} never asks for it (its token_requests() are {sorted(requests)}): "
            f"it would silently do nothing; remove the callback or use a module that calls collect_{request}(...)"
        )
    missing = sorted(frozenset(required_fields) - frozenset(fields_fn()))
    if missing:
        hint = " (policy averages E_p[S])" if "policy_average" in missing else ""
        raise TypeError(
            f"{who} needs the TokenMaskContext fields {missing}{hint}, "
            f"which {name}.token_mask_fields() does not provide"
        )


def token_mask_providers(trainer: Any) -> list[TokenMaskProvider]:
    """The trainer's callbacks that implement :class:`TokenMaskProvider`, in callback order."""
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TokenMaskProvider)]


def token_penalty_providers(trainer: Any) -> list[TokenPenaltyProvider]:
    """The trainer's callbacks that implement :class:`TokenPenaltyProvider`, in callback order."""
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TokenPenaltyProvider)]


def loss_coefficient_providers(trainer: Any) -> list[LossCoefficientProvider]:
    """The trainer's callbacks that implement :class:`LossCoefficientProvider`, in callback order."""
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, LossCoefficientProvider)]


def token_advantage_providers(trainer: Any) -> list[TokenAdvantageProvider]:
    """The trainer's callbacks that implement :class:`TokenAdvantageProvider`, in callback order."""
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TokenAdvantageProvider)]


def token_mask_observers(trainer: Any) -> list[TokenMaskObserver]:
    """The trainer's callbacks that implement :class:`TokenMaskObserver`, in callback order."""
    return [cb for cb in getattr(trainer, "callbacks", []) if isinstance(cb, TokenMaskObserver)]


def required_token_mask_fields(trainer: Any) -> frozenset[str]:
    """Union of the fields all providers need: tells the module what its no-grad pass must compute."""
    needed: frozenset[str] = frozenset()
    providers: list[
        TokenMaskProvider | TokenPenaltyProvider | LossCoefficientProvider | TokenAdvantageProvider | TokenMaskObserver
    ] = [
        *token_mask_providers(trainer),
        *token_penalty_providers(trainer),
        *loss_coefficient_providers(trainer),
        *token_advantage_providers(trainer),
        *token_mask_observers(trainer),
    ]
    for provider in providers:
        needed |= frozenset(provider.required_fields)
    return needed


def collect_keep_mask(trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor:
    """AND of ``context.mask`` with every provider's keep mask; observers then see the result. Call it on every rank.

    Returns:
        bool ``[B, T]``: True where a token stays in the loss.
    """
    keep = context.mask.clone()
    for provider in token_mask_providers(trainer):
        provided = provider.keep_mask(trainer, pl_module, context)
        if provided.shape != keep.shape or provided.dtype != torch.bool:
            raise ValueError(
                f"{type(provider).__name__}.keep_mask returned {provided.dtype} {tuple(provided.shape)}, "
                f"expected torch.bool {tuple(keep.shape)}"
            )
        keep &= provided
    for observer in token_mask_observers(trainer):
        observer.observe_keep_mask(trainer, pl_module, context, keep)
    return keep


def collect_token_advantages(trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor | None:
    """The advantages after every advantage provider, in callback order (each sees the previous one's in
    ``context.advantages``), or None when there is none. Call it on every rank, before :func:`collect_keep_mask`.

    Returns:
        float ``[B, T]``, zero outside ``context.mask``; None without a provider.
    """
    providers = token_advantage_providers(trainer)
    advantages: Tensor | None = None
    for provider in providers:
        shaped = provider.token_advantages(trainer, pl_module, context)
        if shaped.shape != context.mask.shape or not shaped.is_floating_point():
            raise ValueError(
                f"{type(provider).__name__}.token_advantages returned {shaped.dtype} {tuple(shaped.shape)}, "
                f"expected a float tensor of shape {tuple(context.mask.shape)}"
            )
        advantages = shaped.masked_fill(~context.mask, 0.0).float()  # float32, as the estimator's
        context = context.with_row_tensors({"advantages": advantages})
    return advantages


def collect_token_penalty(trainer: Any, pl_module: Any, context: TokenMaskContext) -> Tensor | None:
    """Sum of every penalty provider's per-token coefficients, or None when there is none. Call it on every rank.

    The module adds ``aggregate(coef * |log p - log p_old|)`` to its loss for every update epoch.
    """
    total: Tensor | None = None
    for provider in token_penalty_providers(trainer):
        coef = provider.token_penalty(trainer, pl_module, context)
        if coef.shape != context.mask.shape:
            raise ValueError(
                f"{type(provider).__name__}.token_penalty returned shape {tuple(coef.shape)}, "
                f"expected {tuple(context.mask.shape)}"
            )
        total = coef.float() if total is None else total + coef.float()
    return total


def collect_loss_coefficients(trainer: Any, pl_module: Any, context: TokenMaskContext) -> dict[str, float]:
    """Every coefficient provider's ``{name: value}`` for this batch, later providers winning. Call on every rank.

    Raises:
        ValueError: a provider returned a name the module does not list in ``loss_coefficients()``, or a
            non-finite value.
    """
    known = getattr(pl_module, "loss_coefficients", None)
    allowed = frozenset(known()) if callable(known) else frozenset()
    out: dict[str, float] = {}
    for provider in loss_coefficient_providers(trainer):
        for key, value in provider.loss_coefficients(trainer, pl_module, context).items():
            if key not in allowed or not math.isfinite(float(value)):
                raise ValueError(
                    f"{type(provider).__name__}.loss_coefficients returned {key}={value!r}; "
                    f"{type(pl_module).__name__} accepts finite values for {sorted(allowed)}"
                )
            out[key] = float(value)
    return out

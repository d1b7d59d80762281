"""TokenCallback: the one base of lit_entropy's token-level callbacks.

Every callback that reads a :class:`~lit_entropy.protocol.TokenMaskContext` (mask and penalty
providers, loss-coefficient providers, observers) derives from :class:`TokenCallback`, which owns
what they share:

- **What it asks of the module**: ``required_fields`` (the context fields it reads) and
  ``token_request`` (which of :data:`~lit_entropy.protocol.TOKEN_REQUESTS` it serves), checked at
  ``setup`` so that a module that cannot serve it fails before training.
- **Counters**: :meth:`TokenCallback.count` / :meth:`TokenCallback.count_tokens` tally this rank's
  numbers for the batch; :meth:`TokenCallback.reduce_counts` sums every tally over the ranks in one
  all-reduce and adds the batch to the checkpointed running totals ``num_batches``, ``num_tokens`` and
  ``num_acted_on`` (tokens masked, penalised or selected: whatever the callback does to a token).
- **Tags**: ``train/<prefix>/<name>``, made by :meth:`TokenCallback.tag` from ``log_prefix``.
- **Logging**: :meth:`TokenCallback.log_metrics` logs only when the module is attached to a trainer
  (the callbacks also run on bare contexts in tests and scripts).
- **Checkpoints**: ``state_dict`` / ``load_state_dict`` of the running totals; the key names of older
  checkpoints (``num_masked``, ``num_selected``) load into ``num_acted_on``.

A new token callback is a subclass that sets ``required_fields``, calls its math's ``check_*``
function in ``__init__`` and implements one protocol method (``keep_mask``, ``token_penalty``,
``loss_coefficients`` or ``observe_keep_mask``).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from typing_extensions import override

from lit_entropy.distributed.collectives import all_reduce_sum
from lit_entropy.internals.lightning import attached_trainer
from lit_entropy.protocol import TOKEN_REQUESTS, check_token_masking_module

__all__ = ["LEGACY_STATE_KEYS", "TokenCallback", "check_log_prefix", "module_is_attached"]

#: Counter keys of older checkpoints -> today's key. Each callback counted the tokens it acted on under its
#: own name (``num_masked``: EntropyDiscriminatorClipping, RandomNegativeMasking; ``num_selected``: ClipCov,
#: KLCov, HighEntropySelection, AdaptiveEntropyBonus).
LEGACY_STATE_KEYS: dict[str, str] = {"num_masked": "num_acted_on", "num_selected": "num_acted_on"}

_COUNTER_KEYS = ("num_batches", "num_tokens", "num_acted_on")
_NOT_SETTINGS = frozenset({"self", "log_prefix", "args", "kwargs"})
_PLAIN = (bool, int, float, str, type(None))


def _is_plain(value: Any) -> bool:
    """Plain data (a number, string, None or a list of them), not an object such as a generator."""
    return isinstance(value, _PLAIN) or (isinstance(value, (list, tuple)) and all(isinstance(v, _PLAIN) for v in value))


def check_log_prefix(log_prefix: Any) -> str:
    """Return ``log_prefix`` if it is a non-empty tag prefix without a trailing ``/``, else raise naming it."""
    if not isinstance(log_prefix, str) or not log_prefix.strip("/") or log_prefix.endswith("/"):
        raise ValueError(f"log_prefix must be a non-empty string without a trailing '/', got {log_prefix!r}")
    return log_prefix


def module_is_attached(pl_module: Any) -> bool:
    """Whether ``pl_module`` is a module attached to a trainer, i.e. ``pl_module.log`` would record a value.

    The public ``trainer`` property raises when there is none (hence ``internals.lightning.attached_trainer``),
    and ``log`` without a trainer only warns.
    """
    return callable(getattr(pl_module, "log", None)) and attached_trainer(pl_module) is not None


class TokenCallback(Callback):
    """Base of every token-level callback: requirements, all-reduced counters, tags, logging, checkpoints.

    Attributes:
        required_fields: the :class:`~lit_entropy.protocol.TokenMaskContext` fields the callback reads.
        token_request: the module request it serves (``"keep_mask"`` for mask providers and observers).
        log_prefix: tags are ``<log_prefix>/<name>``.
        num_batches: rollout batches seen (all ranks agree).
        num_tokens: valid tokens seen, summed over ranks.
        num_acted_on: tokens the callback masked / penalised, summed over ranks.
        last_metrics: the metrics of the latest batch (also kept when nothing is logged).
    """

    required_fields: frozenset[str] = frozenset({"mask"})
    token_request: ClassVar[str] = "keep_mask"

    def __init__(self, log_prefix: str) -> None:
        if self.token_request not in TOKEN_REQUESTS:
            raise TypeError(f"{type(self).__name__}.token_request must be one of {TOKEN_REQUESTS}")
        self.log_prefix = check_log_prefix(log_prefix)
        self.num_batches = 0
        self.num_tokens = 0
        self.num_acted_on = 0
        self.last_metrics: dict[str, float] = {}
        self._tallies: dict[str, Tensor] = {}

    def describe(self) -> str:
        """How messages name this callback (the class name; subclasses add their mode)."""
        return type(self).__name__

    def hparams(self) -> dict[str, Any]:
        """The settings this callback runs with (the HPARAMS tab): its plain-data ``__init__`` arguments kept as
        attributes of the same name, without ``log_prefix`` (where it logs, not what it does).

        A subclass whose mode ignores an argument leaves it out (Clip_B has no ``max_frac``).
        """
        names = [name for name in inspect.signature(type(self).__init__).parameters if name not in _NOT_SETTINGS]
        values = {name: getattr(self, name) for name in names if hasattr(self, name)}
        return {name: value for name, value in values.items() if _is_plain(value)}

    def tag(self, name: str) -> str:
        """The logged name ``<log_prefix>/<name>``: one tag scheme for every token callback."""
        return f"{self.log_prefix}/{name}"

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        check_token_masking_module(pl_module, self.required_fields, self.describe(), request=self.token_request)

    # ------------------------------------------------------------------------------------------ counters
    def count(self, name: str, value: Tensor | float) -> None:
        """Add this rank's ``value`` to the batch tally ``name``; :meth:`reduce_counts` sums it over ranks.

        Every rank must count the same names in a batch (the tallies travel in one all-reduce).
        """
        value = torch.as_tensor(value).detach().to(torch.float64)
        previous = self._tallies.get(name)
        self._tallies[name] = value if previous is None else previous + value.to(previous.device)

    def count_tokens(self, mask: Tensor, acted_on: Tensor | None = None) -> None:
        """Tally the valid tokens (``tokens``) and, when given, those the callback acted on (``acted_on``)."""
        self.count("tokens", mask.sum())
        if acted_on is not None:
            self.count("acted_on", (acted_on & mask).sum())

    def reduce_counts(self) -> dict[str, float]:
        """Sum the batch tallies over ranks (one all-reduce; call on every rank) and close the batch.

        Adds ``tokens`` / ``acted_on`` to ``num_tokens`` / ``num_acted_on`` and counts the batch.

        Returns:
            ``{name: global sum}`` of this batch's tallies.
        """
        names = sorted(self._tallies)
        counts: dict[str, float] = {}
        if names:
            # The accelerator's device when any tally lives there (NCCL reduces only device tensors).
            device = next((t.device for t in self._tallies.values() if t.device.type != "cpu"), torch.device("cpu"))
            totals = all_reduce_sum(torch.stack([self._tallies[n].to(device).reshape(()) for n in names]))
            counts = dict(zip(names, totals.tolist(), strict=True))
        self._tallies = {}
        self.num_batches += 1
        self.num_tokens += round(counts.get("tokens", 0.0))
        self.num_acted_on += round(counts.get("acted_on", 0.0))
        return counts

    @staticmethod
    def share(part: float, whole: float) -> float:
        """``part / whole``, 0 for an empty ``whole`` (a batch without such tokens)."""
        return part / max(whole, 1.0)

    # ------------------------------------------------------------------------------------------- logging
    def log_metrics(self, pl_module: Any, metrics: dict[str, float]) -> None:
        """Keep ``metrics`` as ``last_metrics`` and log them per step when the module is attached to a trainer."""
        self.last_metrics = {name: float(value) for name, value in metrics.items()}
        if not module_is_attached(pl_module):
            return
        for name, value in self.last_metrics.items():
            pl_module.log(name, value, on_step=True, on_epoch=False, batch_size=1)

    # ---------------------------------------------------------------------------------------- checkpoints
    @override
    def state_dict(self) -> dict[str, Any]:
        return {key: getattr(self, key) for key in _COUNTER_KEYS}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load the running totals; older checkpoints' counter names are read too (:data:`LEGACY_STATE_KEYS`).

        A counter the checkpoint does not have (written before the counter existed) starts at 0.
        """
        state = {LEGACY_STATE_KEYS.get(key, key): value for key, value in state_dict.items()}
        for key in _COUNTER_KEYS:
            setattr(self, key, int(state.get(key, 0)))

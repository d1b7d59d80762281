"""torchmetrics (1.9) private hooks lit_entropy's metrics override, and Lightning's read of them.

:class:`StepValueMetric` overrides ``Metric._forward_cache`` (which Lightning's result collection reads to
log a metric object per step) and ``Metric._apply``, and reads the states' bookkeeping (``_defaults``,
``_reductions``, ``_update_count``, the sync flags). :class:`Float64StateMetric` reads ``_dtype_convert``.
Pinned by ``tests/internals/test_torchmetrics.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from torch import Tensor
from torchmetrics import Metric
from torchmetrics.utilities.data import dim_zero_sum

__all__ = ["Float64StateMetric", "StepValueMetric"]


class StepValueMetric(Metric):
    """A :class:`~torchmetrics.Metric` that ``self.log(name, metric)`` logs per step after ``update`` too.

    Lightning (2.6) logs a Metric object at step level from ``metric._forward_cache``, which only
    ``forward`` sets: ``metric.update(...)`` then ``self.log(name, metric)`` in a ``training_step``
    (``on_step=True, on_epoch=False`` there) logs nothing at all, without a warning. Here
    ``_forward_cache`` is a property:

    - after ``forward`` it is forward's batch value, exactly as in torchmetrics;
    - after direct ``update`` calls it is the value of the updates since the last ``forward``,
      ``reset`` or read of it (each ``self.log`` reads it), so several updates in one step (PPO
      mini-batches) log the value of that step.

    The value is computed from the states minus a snapshot taken at the last read, not from a hook on
    ``update``: :class:`~torchmetrics.MetricCollection` with compute groups updates only the first
    metric of a group and shares its states with the others. So every state must be a tensor summed
    across updates (``dist_reduce_fx="sum"``) or listed in ``_constant_states``. Like forward's
    batch value it is this rank's value unless ``dist_sync_on_step=True``.
    """

    # States that never change after ``__init__`` (e.g. a clip range kept as a state): used as they are.
    _constant_states: tuple[str, ...] = ()

    @property
    def _forward_cache(self) -> Any:
        value = self.__dict__.get("_step_value")
        if self.__dict__.get("_step_raw", False) or self._update_count == self.__dict__.get("_step_count", 0):
            return value
        # Direct updates since the value was last set or read: compute the value of those updates.
        value = self._window_value()
        self._mark_step(value)
        return value

    @_forward_cache.setter
    def _forward_cache(self, value: Any) -> None:
        # torchmetrics sets it in __init__, reset (to None) and forward (to the batch value).
        self.__dict__["_step_value"] = value
        if not self.__dict__.get("_step_raw", False):
            self._mark_step(value)

    def _mark_step(self, value: Any) -> None:
        """Start a new window of direct updates at the current states."""
        self.__dict__["_step_value"] = value
        self.__dict__["_step_count"] = getattr(self, "_update_count", 0)
        # None (after __init__/reset) means the states are at their defaults.
        snapshot = None if value is None else {k: getattr(self, k).detach().clone() for k in self._defaults}
        self.__dict__["_step_snapshot"] = snapshot

    def _window_value(self) -> Any:
        """``compute()`` over the updates since the last snapshot, local like forward's batch value."""
        current = {name: getattr(self, name) for name in self._defaults}
        snapshot = self.__dict__.get("_step_snapshot") or self._defaults
        window = {}
        for name, value in current.items():
            base = snapshot[name]
            if not isinstance(value, Tensor) or not isinstance(base, Tensor):
                raise TypeError(f"{type(self).__name__}: state {name!r} must be a tensor to log step values")
            if name in self._constant_states:
                window[name] = value
            elif self._reductions[name] is dim_zero_sum:
                window[name] = value - base.to(value)
            else:
                raise TypeError(
                    f"{type(self).__name__}: state {name!r} is neither summed nor in _constant_states, "
                    "so its value over the last updates cannot be recovered"
                )
        saved = (self._computed, self._to_sync, self._should_unsync)
        # As forward does for the batch value: sync only with dist_sync_on_step, keep the global cache.
        self._computed, self._to_sync, self._should_unsync = None, self.dist_sync_on_step, False
        try:
            for name, value in window.items():
                setattr(self, name, value)
            return self.compute()
        finally:
            for name, value in current.items():
                setattr(self, name, value)
            self._computed, self._to_sync, self._should_unsync = saved
            self._is_synced = False

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = "") -> Metric:
        # Moving or casting the metric must neither compute nor restart the window of updates.
        self.__dict__["_step_raw"] = True
        try:
            super()._apply(fn, exclude_state=exclude_state)  # moves this metric in place (and returns it)
            return self
        finally:
            self.__dict__["_step_raw"] = False


class Float64StateMetric(StepValueMetric):
    """A metric whose float64 accumulators ignore module-wide dtype casts.

    torchmetrics blocks ``.half()``/``.float()``/``.double()``/``.type()`` on states but not
    ``.to(dtype)``, which Lightning's ``"16-true"``/``"bf16-true"`` precision plugins call on the
    whole LightningModule; a bf16 running sum stops growing after a few hundred tokens. The states
    named in ``_float64_states`` follow device moves only; ``set_dtype`` still converts them.
    """

    _float64_states: tuple[str, ...] = ()

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = "") -> Metric:
        keep = () if self._dtype_convert else self._float64_states
        excluded = [exclude_state] if isinstance(exclude_state, str) else list(exclude_state)
        super()._apply(fn, exclude_state=[*excluded, *keep])  # moves this metric in place (and returns it)
        # The base class moved a probe tensor with ``fn`` and stored its device: follow it.
        for key in keep:
            default = self._defaults[key]
            if not isinstance(default, Tensor):
                raise TypeError(f"{type(self).__name__}: float64 state {key!r} must be a tensor")
            self._defaults[key] = default.to(self.device)
            setattr(self, key, getattr(self, key).to(self.device))
        return self

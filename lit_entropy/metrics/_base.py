"""Shared pieces of lit_entropy's metrics: float64 accumulators and token-mask checks."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor
from torchmetrics import Metric


class _Float64StateMetric(Metric):
    """A :class:`~torchmetrics.Metric` whose float64 accumulators ignore module-wide dtype casts.

    torchmetrics blocks ``.half()``/``.float()``/``.double()``/``.type()`` on states but not
    ``.to(dtype)``, which Lightning's ``"16-true"``/``"bf16-true"`` precision plugins call on the
    whole LightningModule; a bf16 running sum stops growing after a few hundred tokens. The states
    named in ``_float64_states`` follow device moves only; ``set_dtype`` still converts them.
    """

    _float64_states: tuple[str, ...] = ()

    def _apply(self, fn: Callable, exclude_state: Sequence[str] = "") -> Metric:
        keep = () if self._dtype_convert else self._float64_states
        excluded = [exclude_state] if isinstance(exclude_state, str) else list(exclude_state)
        this = super()._apply(fn, exclude_state=[*excluded, *keep])
        # The base class moved a probe tensor with ``fn`` and stored its device: follow it.
        for key in keep:
            this._defaults[key] = this._defaults[key].to(this.device)
            setattr(this, key, getattr(this, key).to(this.device))
        return this


def _token_mask(mask: Tensor | None, values: Tensor, name: str) -> Tensor:
    """The bool ``[B, T]`` mask of ``values`` (all True when None); ValueError on a wrong dtype or shape."""
    if mask is None:
        return torch.ones_like(values, dtype=torch.bool)
    if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
        got = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"`mask` must be a bool tensor, got {got}")
    if mask.shape != values.shape:
        raise ValueError(f"`mask` shape {tuple(mask.shape)} != `{name}` shape {tuple(values.shape)}")
    return mask

"""The clip fractions a policy loss reports about itself, token-weighted over updates and ranks."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.metrics._base import Float64StateMetric

__all__ = ["LossClipFractions"]


class LossClipFractions(Float64StateMetric):
    r"""Token-weighted clip fractions of the policy loss's own ``PolicyLossStats``, accumulated over updates.

    Every registered policy loss says which of its loss tokens its clip binds on (``clip_frac_low``,
    ``clip_frac_high``, ``clip_frac``, ``dual_clip_frac``, each a mean over the call's loss tokens): PPO per
    token, GSPO per sequence (all the loss tokens of a clipped sequence), GMPO per token in log space, CISPO
    per capped weight. :class:`~lit_entropy.metrics.ClipRatio` instead recomputes PPO's token rule from the
    token ratios, which misreports every other loss. This metric re-weights each call's fractions by its
    number of loss tokens, so the result is the fraction over every loss token seen since the last
    ``reset``, summed across ranks when synced.

    As input to ``update``: ``stats`` (a :class:`~lit_entropy.functional.PolicyLossStats` or anything with its
    four fraction fields) and ``tokens``, the number of loss tokens the call averaged over.

    As output of ``compute``: a dict of float64 scalars ``low``, ``high``, ``total`` (``clip_frac``) and
    ``dual``; NaN when no loss token was seen.

    Example:
        >>> import torch
        >>> from lit_entropy.functional import PolicyLossStats
        >>> metric = LossClipFractions()
        >>> t = torch.tensor
        >>> metric.update(PolicyLossStats(t(0.5), t(0.0), t(0.5), t(0.0), t(0.0), t(1.0)), tokens=4)
        >>> metric.update(PolicyLossStats(t(0.0), t(0.25), t(0.25), t(0.0), t(0.0), t(1.0)), tokens=12)
        >>> {k: round(v.item(), 4) for k, v in metric.compute().items()}
        {'low': 0.125, 'high': 0.1875, 'total': 0.3125, 'dual': 0.0}
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False
    _float64_states = ("sums", "num_tokens")

    sums: Tensor
    num_tokens: Tensor

    _FIELDS = (("low", "clip_frac_low"), ("high", "clip_frac_high"), ("total", "clip_frac"), ("dual", "dual_clip_frac"))

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.add_state("sums", default=torch.zeros(len(self._FIELDS), dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("num_tokens", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, stats: Any, tokens: int | Tensor) -> None:
        """Add one policy-loss call's fractions, weighted by its ``tokens`` loss tokens (>= 0)."""
        n = torch.as_tensor(tokens, dtype=torch.float64, device=self.sums.device).detach()
        if n.numel() != 1 or not bool(n >= 0):
            raise ValueError(f"`tokens` must be one count >= 0, got {tokens!r}")
        if bool(n == 0):  # an empty call's fractions are 0/0 placeholders
            return
        fractions = [torch.as_tensor(getattr(stats, field)).detach() for _, field in self._FIELDS]
        self.sums += torch.stack([f.to(torch.float64, copy=False).to(self.sums.device) for f in fractions]) * n
        self.num_tokens += n

    def compute(self) -> dict[str, Tensor]:
        """The token-weighted fractions ``low``, ``high``, ``total``, ``dual`` (float64; NaN if no token)."""
        values = self.sums / self.num_tokens
        return {name: values[i] for i, (name, _) in enumerate(self._FIELDS)}

"""Per-token KL estimators between the policy and a reference model (Schulman's k1 / k2 / k3).

With ``x`` sampled from the policy ``p`` and ``log_ratio = log p(x) - log ref(x)``:

- ``k1`` (alias ``"kl"``): ``log_ratio``; unbiased for KL(p || ref), high variance, can be negative.
- ``k2`` (alias ``"mse"``): ``0.5 * log_ratio^2``; biased, low variance, >= 0.
- ``k3`` (alias ``"low_var_kl"``): ``exp(-log_ratio) + log_ratio - 1``; unbiased, >= 0.
  For stability it follows verl's ``low_var_kl``: the log-ratio is clamped to [-20, 20] and the
  result to at most 10 (so a token whose reference log-prob exceeds the policy's by more than
  ~2.5 nats contributes a constant 10 with zero gradient).
- ``abs``: ``|log_ratio|``.

A trailing ``"+"`` (e.g. ``"k3+"``, as in verl) keeps the value of the named estimator but
back-propagates the gradient of ``k2`` (a straight-through trick: k2's gradient is the
unbiased KL gradient estimate when the samples come from the current policy).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.functional.checks import check_choice
from lit_entropy.functional.losses.ratio import LOG_RATIO_CLAMP

__all__ = ["KL_KINDS", "check_kl_type", "kl_penalty"]

_ALIASES = {"k1": "k1", "kl": "k1", "k2": "k2", "mse": "k2", "k3": "k3", "low_var_kl": "k3", "abs": "abs"}
KL_KINDS: tuple[str, ...] = tuple(_ALIASES) + tuple(f"{k}+" for k in _ALIASES)

_K3_MAX = 10.0


def check_kl_type(kind: str, name: str = "kind") -> str:
    """Validate a KL estimator name against :data:`KL_KINDS`; ``name`` is the argument or setting name."""
    return check_choice(name, kind, KL_KINDS)


def _estimate(log_ratio: Tensor, kind: str) -> Tensor:
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio.square()
    if kind == "abs":
        return log_ratio.abs()
    # k3: with d = log ref - log p, exp(d) - d - 1.
    d = (-log_ratio).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)
    return (torch.exp(d) - d - 1.0).clamp(max=_K3_MAX)


def kl_penalty(logprobs: Tensor, ref_logprobs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token KL(policy || reference) estimate.

    Args:
        logprobs: log-probs of the sampled tokens under the policy, any shape (e.g. ``[B, T]``).
        ref_logprobs: the same tokens' log-probs under the reference model, same shape.
        kind: one of :data:`KL_KINDS` (see the module docstring).

    Returns:
        Tensor of ``logprobs``' shape (differentiable w.r.t. both inputs). No masking: aggregate
        with ``lit_entropy.functional.losses.aggregation.aggregate_loss``.
    """
    check_kl_type(kind)
    if logprobs.shape != ref_logprobs.shape:
        raise ValueError(
            f"ref_logprobs shape {tuple(ref_logprobs.shape)} does not match logprobs shape {tuple(logprobs.shape)}"
        )
    straight_through = kind.endswith("+")
    name = _ALIASES[kind.rstrip("+")]
    log_ratio = logprobs - ref_logprobs
    value = _estimate(log_ratio, name)
    if not straight_through:
        return value
    surrogate = _estimate(log_ratio, "k2")
    return surrogate - surrogate.detach() + value.detach()

"""The blockwise pass over the logits that the fused head kernels share: :func:`~.linear.linear_entropy_stats`
and :func:`~.linear_loss.linear_entropy_loss` compute the logits ``h @ W.T + b`` one ``[rows, vocab_cols]``
block at a time and reduce them with an online (streaming) log-sum-exp (see :mod:`.linear` for the algorithm).

Here: the check of ``(hidden, weight, token_ids, bias)``, the block size, the logits of one block (in the input
dtype, as the model's own head computes them), one block's per-row statistics, their merge into the running
state, the final ``(log p_k, H, S, E_p[S])``, and the per-row coefficients of the logits gradient.
"""

from __future__ import annotations

import torch
from torch import Tensor

from lit_entropy.functional.entropy.logits import entropy_discriminator
from lit_entropy.functional.entropy.numerics import check_token_ids

__all__ = [
    "block_logits",
    "block_statistics",
    "check_head_inputs",
    "finish_statistics",
    "merge_block",
    "resolve_block",
    "row_coefficients",
    "row_dot",
    "scaled_block_logits",
]


def check_head_inputs(hidden: Tensor, weight: Tensor, token_ids: Tensor, bias: Tensor | None) -> None:
    """Refuse hidden states ``[..., H]``, a head ``weight [V, H]`` / ``bias [V]`` and ``token_ids [...]`` that do
    not fit together (shapes, dtypes, one device, ids in ``[0, V)``)."""
    for name, t in (("hidden", hidden), ("weight", weight), ("token_ids", token_ids)):
        if not isinstance(t, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if not hidden.is_floating_point() or hidden.dim() < 1:
        raise ValueError(
            f"hidden must be a floating-point tensor [..., H], got dtype={hidden.dtype} shape={tuple(hidden.shape)}"
        )
    if weight.dim() != 2 or weight.shape[0] == 0 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(
            f"weight must be [V, H] with H = hidden.shape[-1] = {hidden.shape[-1]} and V > 0, "
            f"got weight.shape={tuple(weight.shape)}"
        )
    if weight.dtype != hidden.dtype:
        raise ValueError(f"weight.dtype must equal hidden.dtype={hidden.dtype}, got weight.dtype={weight.dtype}")
    if bias is not None:
        if not isinstance(bias, Tensor) or tuple(bias.shape) != (weight.shape[0],) or bias.dtype != weight.dtype:
            got = f"{tuple(bias.shape)} {bias.dtype}" if isinstance(bias, Tensor) else type(bias).__name__
            raise ValueError(f"bias must be a [{weight.shape[0]}] tensor of dtype {weight.dtype}, got {got}")
    devices = {t.device for t in (hidden, weight, token_ids) + (() if bias is None else (bias,))}
    if len(devices) > 1:
        raise ValueError(f"hidden, weight, bias and token_ids must be on one device, got {sorted(map(str, devices))}")
    check_token_ids(token_ids, hidden.shape[:-1], weight.shape[0], source="hidden")


def resolve_block(name: str, value: int | None, default: int) -> int:
    """A block size: ``value`` (a positive int, named ``name`` in the error), or ``default`` when None."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")
    return value


def block_logits(hb: Tensor, wc: Tensor, bc: Tensor | None, out: Tensor) -> Tensor:
    """``out = hb @ wc.T (+ bc)`` (``[r, H]``, ``[c, H]``, ``[c]`` -> ``[r, c]``) in the input dtype, written into a
    reused buffer: the same ``mm`` / ``addmm`` as an ``nn.Linear`` head, so the same logits."""
    if bc is None:
        return torch.mm(hb, wc.T, out=out)
    return torch.addmm(bc, hb, wc.T, out=out)


def scaled_block_logits(hb: Tensor, wc: Tensor, bc: Tensor | None, inv_t: float, x: Tensor, mm: Tensor | None) -> None:
    """``x = (hb @ wc.T + bc) / T`` in the compute dtype; the matmul runs in the input dtype (into ``mm`` when that
    is narrower than ``x``, as the model's own head rounds its logits)."""
    if mm is None:
        block_logits(hb, wc, bc, out=x)
        if inv_t != 1.0:
            x.mul_(inv_t)
    else:
        torch.mul(block_logits(hb, wc, bc, out=mm), inv_t, out=x)


def row_dot(a: Tensor, b: Tensor, tmp: Tensor, out: Tensor) -> Tensor:
    """``(a * b).sum(-1)`` of ``[r, c]`` blocks into ``out`` ``[r]``, using the reused buffer ``tmp``.

    ``torch.linalg.vecdot`` allocates an ``[r, c]`` temporary per call and is ~2x slower on CPU (measured).
    """
    return torch.sum(torch.mul(a, b, out=tmp), dim=1, out=out)


def block_statistics(x: Tensor, e: Tensor, t: Tensor, vec: Tensor, floor: float, want_average: bool) -> None:
    """Per-row statistics of one logits block ``x`` (scaled by 1/T), relative to the block's row max.

    Writes ``vec[0:5] = (max, Z = sum e, A = sum e y, B = sum e^2, C = sum e^2 y)`` with ``y = x - max`` and
    ``e = exp(y)`` (B and C only with ``want_average``); ``x``, ``e`` and ``t`` are overwritten.
    """
    mc, zc, ac, bcs, ccs = vec[:5].unbind(0)
    torch.amax(x, dim=1, out=mc)
    x.sub_(mc.unsqueeze(1)).clamp_(min=floor)  # y = x - max <= 0, floored against denormals
    torch.exp(x, out=e)
    torch.sum(e, dim=1, out=zc)
    row_dot(e, x, t, out=ac)  # t = e y
    if want_average:
        torch.sum(t.mul_(e), dim=1, out=ccs)  # e^2 y
        row_dot(e, e, t, out=bcs)


def merge_block(state: Tensor, vec: Tensor, want_average: bool) -> None:
    """Merge a block's statistics ``vec`` (relative to its max) into the running ``state`` (relative to m).

    Shifting the reference from m to m' = max(m, mc) multiplies e by exp(-d) and adds -d to y, d = m' - m:
    A' = s_old (A + d_old Z) + s_new (A_c + d_new Z_c); the same with s^2 for C from B.
    """
    mc, zc, ac, bcs, ccs, d_old, s_old, s_new = vec.unbind(0)
    mo, zo, ao = state[0], state[1], state[2]
    torch.sub(mo, mc, out=d_old).clamp_(max=0.0)  # m - m' <= 0
    torch.sub(mc, mo, out=mc).clamp_(max=0.0)  # mc - m' <= 0 (mc now holds the block's shift)
    torch.exp(d_old, out=s_old)
    torch.exp(mc, out=s_new)
    mo.sub_(d_old)  # m' = m - (m - m')
    if want_average:
        bo, co = state[3], state[4]
        co.addcmul_(d_old, bo).mul_(s_old).mul_(s_old)
        ccs.addcmul_(mc, bcs).mul_(s_new).mul_(s_new)
        co.add_(ccs)
        bo.mul_(s_old).mul_(s_old).addcmul_(bcs, s_new * s_new)
    ao.addcmul_(d_old, zo).mul_(s_old)
    ac.addcmul_(mc, zc).mul_(s_new)
    ao.add_(ac)
    zo.mul_(s_old).addcmul_(zc, s_new)


def finish_statistics(
    h: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, inv_t: float, state: Tensor, want_average: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """``(log p_k, H, S, E_p[S] | None, shift)`` from the merged per-row state ``(m, Z, A[, B, C])``."""
    m, z_sum, a_sum = state[0], state[1], state[2]
    log_z = torch.log(z_sum)
    entropy = log_z - a_sum / z_sum  # both terms >= 0: no cancellation
    shift = m + log_z
    # The sampled token's logit by a direct dot product, rounded to the matmul dtype like the blocks.
    cdt = state.dtype
    z_tok = torch.linalg.vecdot(h.to(cdt), weight[ids].to(cdt))
    if bias is not None:
        z_tok += bias[ids].to(cdt)
    logp = z_tok.to(h.dtype).to(cdt).mul_(inv_t).sub_(shift)
    avg = None
    if want_average:
        b_sum, c_sum = state[3], state[4]
        z2 = z_sum * z_sum
        avg = c_sum / z2 - (b_sum / z2) * (a_sum / z_sum)
    return logp, entropy, entropy_discriminator(logp, entropy), avg, shift


def row_coefficients(
    entropy: Tensor, grad_logp: Tensor | None, grad_h: Tensor | None, inv_t: float, cdt: torch.dtype
) -> tuple[Tensor | None, Tensor, Tensor | None]:
    """Per-row ``(a, b, c)`` of ``dL/dz = p (a log p + b) + c e_k``.

    ``a = -g_H / T``, ``c = g_lp / T``, ``b = a H - c`` (``a`` / ``c`` None when that output has no gradient).
    """
    a = None if grad_h is None else grad_h.reshape(-1).to(cdt) * -inv_t
    c = None if grad_logp is None else grad_logp.reshape(-1).to(cdt) * inv_t
    if a is not None:
        b = a * entropy if c is None else a * entropy - c
    elif c is not None:
        b = -c
    else:
        raise ValueError("row_coefficients needs the gradient of the log-probabilities, of the entropy or both")
    return a, b, c

"""Token entropy, entropy discriminator and first-order entropy change (THEORY.md sections 1-2).

Everything here works on raw logits ``[..., V]`` (V = vocabulary size) and returns per-position
tensors of shape ``[...]``. Entropies and log-probabilities are in nats. The policy at a
position is ``p = softmax(z / T)`` for logits ``z`` and sampling temperature ``T``.

Memory: an LLM's logits are the largest tensor of an RL step (``[2048, 151936]`` float32 is
1.2 GB), so a naive ``log_softmax`` + ``exp`` pipeline multiplies peak memory several times.
The functions here walk the rows in chunks, reuse two preallocated float32 chunk buffers and
keep only a few per-row scalars; the backward pass recomputes the softmax chunk by chunk and
writes into the preallocated gradient. Shifted logits are floored (``X_FLOOR``) so that no
denormal floats appear (they slow CPU arithmetic ~80x) and masked ``-inf`` logits give no NaN.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any, NamedTuple

import torch
from torch import Tensor

from lit_entropy.functional.entropy.numerics import X_FLOOR, check_temperature, check_token_ids
from lit_entropy.functional.masked import compute_dtype

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "EntropyStats",
    "default_chunk_rows",
    "entropy_discriminator",
    "entropy_from_logits",
    "entropy_stats",
    "predicted_entropy_change",
]

#: Byte budget of ONE chunk buffer per device type (two buffers are used). On CPU a chunk must stay
#: in the core's L2 cache across the ~9 passes over it (measured: 1 row of a 151936 vocabulary is
#: ~2x faster than 6 rows); accelerators want large chunks to amortise kernel launches.
DEFAULT_CHUNK_BYTES: dict[str, int] = {"cpu": 1 << 20, "default": 32 << 20}

# Log-probs below this have exp() == 0 even in float64; used to avoid 0 * (-inf) in S.
_LOG_FLOOR = -1.0e4


class EntropyStats(NamedTuple):
    """Per-position statistics of ``p = softmax(logits / T)``; every field has shape ``logits.shape[:-1]``.

    Attributes:
        logprobs: ``log p_k`` of the given token ``k`` (nats); differentiable w.r.t. the logits.
        entropy: ``H = -sum_i p_i log p_i`` (nats); differentiable w.r.t. the logits.
        discriminator: ``S_k = p_k (H + log p_k)`` of the token (detached).
        policy_average: ``E_p[S] = H sum_i p_i^2 + sum_i p_i^2 log p_i`` (detached), or ``None``
            when not requested.
    """

    logprobs: Tensor
    entropy: Tensor
    discriminator: Tensor
    policy_average: Tensor | None


def default_chunk_rows(
    vocab_size: int, *, device: torch.device | str | None = None, chunk_bytes: int | None = None
) -> int:
    """Rows per chunk so that one float32 ``[rows, vocab_size]`` buffer takes about ``chunk_bytes``.

    Args:
        vocab_size: V, the size of the last logits dim.
        device: where the logits live; picks ``DEFAULT_CHUNK_BYTES[device.type]`` (CPU when None).
        chunk_bytes: explicit byte budget per buffer, overriding the device default.
    """
    if vocab_size <= 0:
        raise ValueError(f"vocab_size must be positive, got {vocab_size}")
    if chunk_bytes is None:
        kind = torch.device(device).type if device is not None else "cpu"
        chunk_bytes = DEFAULT_CHUNK_BYTES.get(kind, DEFAULT_CHUNK_BYTES["default"])
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
    return max(1, chunk_bytes // (4 * vocab_size))


# ----------------------------------------------------------------------------------------------
# validation helpers
# ----------------------------------------------------------------------------------------------


def _check_logits(logits: Tensor) -> None:
    if not isinstance(logits, Tensor):
        raise ValueError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.is_floating_point():
        raise ValueError(f"logits must be a floating-point tensor, got dtype={logits.dtype}")
    if logits.dim() < 1 or logits.shape[-1] == 0:
        raise ValueError(f"logits must have a non-empty last (vocabulary) dim, got shape={tuple(logits.shape)}")


def _resolve_chunk_size(chunk_size: int | None, logits: Tensor) -> int:
    if chunk_size is None:
        return default_chunk_rows(logits.shape[-1], device=logits.device)
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive int (rows per chunk) or None, got {chunk_size!r}")
    return chunk_size


# ----------------------------------------------------------------------------------------------
# chunked kernels (no autograd inside)
# ----------------------------------------------------------------------------------------------


def _row_blocks(logits: Tensor) -> list[Tensor]:
    """2-D ``[rows, V]`` views covering all rows of ``logits`` in flattened (``reshape(-1, V)``) order.

    ``reshape`` would silently copy a non-viewable tensor (e.g. ``model_logits[:, :-1]``), i.e. the
    whole logits; splitting along leading dims instead keeps every block a view.
    """
    vocab = logits.shape[-1]
    try:
        return [logits.view(-1, vocab)]
    except RuntimeError:
        return [block for sub in logits.unbind(0) for block in _row_blocks(sub)]


def _iter_chunks(blocks: list[Tensor], chunk: int) -> Iterator[tuple[int, Tensor]]:
    """Yield ``(row_offset, z_chunk)`` with ``z_chunk`` a ``[r <= chunk, V]`` view."""
    offset = 0
    for block in blocks:
        n = block.shape[0]
        for start in range(0, n, chunk):
            z = block[start : start + chunk]
            yield offset + start, z
        offset += n


def _shift_logits(z: Tensor, shift: Tensor, inv_t: float, out: Tensor) -> None:
    """``out = (z - shift) / T`` in one pass, computed in ``out``'s dtype (bf16/fp16 are upcast)."""
    # add(input=-shift/T, other=z, alpha=1/T) = (z - shift)/T fuses subtraction and temperature; both
    # operands have dims, so a float32 shift promotes a bf16/fp16 z to float32.
    torch.add(shift * (-inv_t), z, alpha=inv_t, out=out)


# Below this vocabulary size a CPU chunk holds many rows, and a vectorised row dot beats a per-row loop.
_CPU_DOT_LOOP_MIN_VOCAB = 4096


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(-1)`` for ``[r, V]`` operands without a ``[r, V]`` temporary."""
    if a.device.type == "cpu" and a.shape[-1] >= _CPU_DOT_LOOP_MIN_VOCAB:
        # CPU bmm of [r,1,V] @ [r,V,1] is ~20x slower per row than torch.dot for r > 1 (measured at V=151936).
        return torch.stack([torch.dot(a[i], b[i]) for i in range(a.shape[0])])
    if a.device.type == "cpu":
        # Small vocabularies come in chunks of thousands of short rows: a Python loop would dominate
        # (30 ms vs 0.02 ms for 768 rows of V=18, measured), and a [r, V] temporary is tiny.
        dots: Tensor = torch.linalg.vecdot(a, b)  # torch.linalg's stubs return Any
        return dots
    return torch.bmm(a.unsqueeze(1), b.unsqueeze(2)).view(a.shape[0])


def _forward_kernel(
    logits: Tensor, token_ids: Tensor, inv_t: float, chunk: int, want_average: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor]:
    """One pass per chunk. Returns flat ``(logp, H, S, E_p[S] | None, row_max, log_z)``.

    With ``x = (z - max z) / T`` (clamped below), ``e = exp(x)``, ``Z = sum e``:
    ``log p = x - log Z``, ``H = log Z - sum(e x) / Z`` and
    ``E_p[S] = sum p^2 log p + H sum p^2 = sum(e^2 x) / Z^2 - (sum e^2 / Z^2) (sum(e x) / Z)``.
    """
    vocab = logits.shape[-1]
    n = token_ids.numel()
    cdt = compute_dtype(logits)
    dev = logits.device
    floor = X_FLOOR[cdt]
    logp_out = torch.empty(n, dtype=cdt, device=dev)
    h_out = torch.empty(n, dtype=cdt, device=dev)
    avg_out = torch.empty(n, dtype=cdt, device=dev) if want_average else None
    zmax_out = torch.empty(n, dtype=cdt, device=dev)
    logz_out = torch.empty(n, dtype=cdt, device=dev)
    if n == 0:
        return logp_out, h_out, h_out.clone(), avg_out, zmax_out, logz_out

    rows = min(chunk, n)
    x_buf = torch.empty(rows, vocab, dtype=cdt, device=dev)
    e_buf = torch.empty(rows, vocab, dtype=cdt, device=dev)
    for start, z in _iter_chunks(_row_blocks(logits), chunk):
        r = z.shape[0]
        sl = slice(start, start + r)
        x, e = x_buf[:r], e_buf[:r]
        zmax = z.amax(dim=-1, keepdim=True).to(cdt)
        zmax_out[sl] = zmax.squeeze(-1)
        _shift_logits(z, zmax, inv_t, x)
        # log p of the sampled token before the floor, so it is exact (and -inf for a masked token).
        logp_out[sl] = x.gather(1, token_ids[sl].unsqueeze(1)).squeeze(1)
        x.clamp_(min=floor)
        torch.exp(x, out=e)  # e <= 1 and x <= 0
        z_sum = e.sum(dim=-1)  # >= 1
        ex = _row_dot(e, x)
        log_z = torch.log(z_sum)
        # H = log Z - sum(e x)/Z: both terms are >= 0, so no cancellation.
        h_out[sl] = log_z - ex / z_sum
        logz_out[sl] = log_z
        logp_out[sl] -= log_z
        if avg_out is not None:
            ee = _row_dot(e, e)
            x.mul_(e)  # x <- e x; x itself is not needed any more
            eex = _row_dot(x, e)
            z2 = z_sum * z_sum
            avg_out[sl] = eex / z2 - (ee / z2) * (ex / z_sum)
    s_out = entropy_discriminator(logp_out, h_out)
    return logp_out, h_out, s_out, avg_out, zmax_out, logz_out


def _backward_kernel(
    logits: Tensor,
    token_ids: Tensor,
    zmax: Tensor,
    log_z: Tensor,
    entropy: Tensor,
    grad_logp: Tensor | None,
    grad_h: Tensor | None,
    inv_t: float,
    chunk: int,
) -> Tensor:
    """Gradient w.r.t. ``logits``: ``g_lp (e_k - p) / T - g_H S / T`` with ``S = p (H + log p)`` per entry."""
    vocab = logits.shape[-1]
    n = token_ids.numel()
    cdt = compute_dtype(logits)
    floor = X_FLOOR[cdt]
    grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
    if n == 0:
        return grad
    grad2d = grad.view(-1, vocab)
    rows = min(chunk, n)
    # float32/float64 logits: compute straight into the preallocated gradient (no copy-back).
    x_buf = None if grad.dtype == cdt else torch.empty(rows, vocab, dtype=cdt, device=logits.device)
    e_buf = torch.empty(rows, vocab, dtype=cdt, device=logits.device)

    # log p = (z - shift) / T with shift = max z + T log Z: one pass instead of two.
    shift = zmax + log_z / inv_t
    # Per-row coefficients: grad = p * (a * log p + b) (+ c at the token); -1/T is folded in.
    a = None if grad_h is None else -inv_t * grad_h.reshape(-1).to(cdt)
    c = None if grad_logp is None else inv_t * grad_logp.reshape(-1).to(cdt)
    if a is not None:
        b = a * entropy if c is None else a * entropy - c
    elif c is not None:
        b = -c
    else:
        raise ValueError("the entropy statistics' backward needs the gradient of the log-probabilities or entropy")

    for start, z in _iter_chunks(_row_blocks(logits), chunk):
        r = z.shape[0]
        sl = slice(start, start + r)
        x = grad2d[sl] if x_buf is None else x_buf[:r]
        e = e_buf[:r]
        _shift_logits(z, shift[sl].unsqueeze(1), inv_t, x)
        # Same floor as the forward (minus log Z): p < 4e-18 there either way; no -inf, no denormals.
        x.clamp_(min=floor)
        torch.exp(x, out=e)  # e = p
        if a is not None:
            torch.addcmul(b[sl].unsqueeze(1), x, a[sl].unsqueeze(1), out=x).mul_(e)
        else:
            torch.mul(e, b[sl].unsqueeze(1), out=x)
        if c is not None:
            x.scatter_add_(1, token_ids[sl].unsqueeze(1), c[sl].unsqueeze(1))
        if x_buf is not None:
            grad2d[sl].copy_(x)
    return grad


class _EntropyStatsFn(torch.autograd.Function):
    """Chunked softmax statistics whose backward recomputes the softmax chunk by chunk."""

    @staticmethod
    def forward(
        ctx: Any, logits: Tensor, token_ids: Tensor, inv_t: float, chunk: int, want_average: bool
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        logp, h, s, avg, zmax, log_z = _forward_kernel(logits, token_ids, inv_t, chunk, want_average)
        if avg is None:
            avg = s.new_empty(0)
        ctx.save_for_backward(logits, token_ids, zmax, log_z, h)
        ctx.inv_t, ctx.chunk = inv_t, chunk
        ctx.mark_non_differentiable(s, avg)
        ctx.set_materialize_grads(False)
        return logp, h, s, avg

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_h: Tensor | None, _grad_s: Tensor | None, _grad_avg: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        if not ctx.needs_input_grad[0] or (grad_logp is None and grad_h is None):
            return None, None, None, None, None
        logits, token_ids, zmax, log_z, h = ctx.saved_tensors
        grad = _backward_kernel(logits, token_ids, zmax, log_z, h, grad_logp, grad_h, ctx.inv_t, ctx.chunk)
        return grad, None, None, None, None


# ----------------------------------------------------------------------------------------------
# public API
# ----------------------------------------------------------------------------------------------


def entropy_stats(
    logits: Tensor,
    token_ids: Tensor,
    *,
    temperature: float = 1.0,
    chunk_size: int | None = None,
    policy_average: bool = False,
) -> EntropyStats:
    """Log-prob, entropy, discriminator (and policy average) of ``softmax(logits / T)`` in one pass.

    Args:
        logits: ``[..., V]`` float tensor (bf16/fp16/fp32/fp64).
        token_ids: ``[...]`` integer tensor of the sampled tokens, values in ``[0, V)``.
        temperature: ``T > 0``; the policy is ``softmax(logits / T)``.
        chunk_size: rows (positions) per chunk; ``None`` picks ``default_chunk_rows(V)``.
        policy_average: also compute ``E_p[S]`` (two extra dot products per row).

    Returns:
        :class:`EntropyStats`, each field ``[...]`` in float32 (float64 for float64 logits).
        ``logprobs`` and ``entropy`` carry gradients to ``logits``; the backward pass recomputes the
        softmax per chunk (``d log p_k/dz = (e_k - p)/T``, ``dH/dz = -S/T``) and keeps no
        vocabulary-sized tensor besides the gradient itself.
    """
    _check_logits(logits)
    check_token_ids(token_ids, logits.shape[:-1], logits.shape[-1])
    inv_t = 1.0 / check_temperature(temperature)
    chunk = _resolve_chunk_size(chunk_size, logits)
    shape = logits.shape[:-1]
    ids = token_ids.reshape(-1).to(torch.long)
    if torch.is_grad_enabled() and logits.requires_grad:
        # torch types Function.apply without annotations.
        logp, h, s, avg = _EntropyStatsFn.apply(logits, ids, inv_t, chunk, policy_average)  # type: ignore[no-untyped-call]
        avg = avg if policy_average else None
    else:
        logp, h, s, avg, _, _ = _forward_kernel(logits.detach(), ids, inv_t, chunk, policy_average)
    return EntropyStats(
        logprobs=logp.view(shape),
        entropy=h.view(shape),
        discriminator=s.view(shape),
        policy_average=None if avg is None else avg.view(shape),
    )


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0, chunk_size: int | None = None) -> Tensor:
    """Entropy in nats of ``softmax(logits / T)`` over the last dim.

    Args:
        logits: ``[..., V]`` float tensor.
        temperature: ``T > 0``.
        chunk_size: rows per chunk (``None``: about ``DEFAULT_CHUNK_BYTES`` per buffer).

    Returns:
        ``[...]`` entropy, float32 (float64 for float64 logits); differentiable w.r.t. ``logits``.
    """
    _check_logits(logits)
    token_ids = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return entropy_stats(logits, token_ids, temperature=temperature, chunk_size=chunk_size).entropy


def entropy_discriminator(logprobs: Tensor, entropy: Tensor) -> Tensor:
    """Entropy discriminator ``S = p (H + log p)`` of a token from its log-prob and the entropy.

    Args:
        logprobs: ``log p_k`` of the token, any shape (nats).
        entropy: ``H`` at the same positions, broadcastable to ``logprobs`` (nats).

    Returns:
        ``S`` with the broadcast shape. ``S > 0`` iff ``p_k > exp(-H)``. A ``-inf`` log-prob gives 0.
    """
    # The clamp only changes log-probs whose exp() is exactly 0, and avoids 0 * (-inf) = NaN.
    return torch.exp(logprobs) * (entropy + logprobs.clamp(min=_LOG_FLOOR))


def predicted_entropy_change(
    discriminator: Tensor,
    policy_average: Tensor,
    advantages: Tensor,
    *,
    ratio: Tensor | None = None,
    lr: float = 1.0,
) -> Tensor:
    """First-order entropy change of one policy-gradient step, per token (THEORY.md section 2).

    A step of size ``lr`` on ``ratio * A * log p_k`` moves the logits by ``lr * ratio * A * (e_k - p)``
    (at ``T = 1``), which changes the entropy by ``-lr * ratio * A * (S_k - E_p[S]) + O(lr^2)``.

    Args:
        discriminator: ``S_k`` per token, ``[...]``.
        policy_average: ``E_p[S]`` per token, same shape.
        advantages: ``A``, broadcastable to ``discriminator`` (e.g. ``[B, 1]`` per sequence).
        ratio: importance ratio ``r``, broadcastable; ``None`` means 1.
        lr: step size ``eta >= 0``.

    Returns:
        Predicted ``dH`` in nats, with the broadcast shape.
    """
    lr_f = float(lr)
    if not (math.isfinite(lr_f) and lr_f >= 0.0):
        raise ValueError(f"lr must be a finite number >= 0, got {lr!r}")
    shapes = {
        "discriminator": discriminator.shape,
        "policy_average": policy_average.shape,
        "advantages": advantages.shape,
    }
    if ratio is not None:
        shapes["ratio"] = ratio.shape
    try:
        torch.broadcast_shapes(*shapes.values())  # type: ignore[no-untyped-call]  # torch leaves it unannotated
    except RuntimeError as err:
        detail = ", ".join(f"{k}={tuple(v)}" for k, v in shapes.items())
        raise ValueError(f"shapes do not broadcast: {detail}") from err
    step = advantages if ratio is None else ratio * advantages
    return -lr_f * step * (discriminator - policy_average)

"""A per-token loss of log-probs and entropy straight from hidden states and the LM head, its gradient computed
in the same pass over the logits (no recompute, logits never materialised).

:func:`~lit_entropy.functional.linear_entropy_stats` must recompute every logits block in the backward because
it does not know the loss: four head-sized matmuls per forward + backward. When the loss is known up front
(a separate update forward: PPO, several epochs or mini-batches), the gradient can be formed while the logits
are at hand, as Liger's fused linear cross-entropy does: three matmuls. Per chunk of rows:

1. the chunk's scaled logits ``z / T`` are computed block by block into a ``[rows, V]`` buffer while the
   streaming statistics (THEORY.md sections 1-2: ``log p_k``, ``H``, ``S``, optionally ``E_p[S]``) run on
   each block, as in ``linear_entropy_stats``;
2. ``loss_fn`` is differentiated w.r.t. the chunk's log-probs and entropies (``g_lp``, ``g_H``, one small
   autograd call on ``[N]`` vectors);
3. each block becomes ``dL/dz = p (a log p + b)`` (``a = -g_H / T``, ``b = a H - g_lp / T``) and is multiplied
   into the hidden-state gradient ``[N, H]`` and the weight gradient ``[V, H]``; the sampled token's term is
   added by a gather and an ``index_add``.

The backward only scales the stored gradients by the incoming one (so it can run once per call).

Contract on ``loss_fn``: it maps ``(logprobs, entropy)`` (shape ``hidden.shape[:-1]``) to a scalar that is a sum
of per-token terms, the term of token ``i`` depending only on ``logprobs[i]`` and ``entropy[i]`` (every loss of
:func:`~lit_entropy.step.update_loss` is: clipped surrogate, KL, entropy bonus and token penalty, aggregated with
fixed weights once the global normalizer is given). It is called once per row chunk on vectors whose rows after
the chunk hold zeros, and once at the end on the final values (the returned loss).

Memory (float32, N rows, V vocabulary, H hidden): one ``[rows, V]`` logits buffer (``LOSS_BLOCK``: 128 rows on
CPU, 78 MB at V = 151,936: 0.066x of the logits at N = 2048), two ``[rows, vocab_cols]`` blocks, the
``[N, H]`` hidden-state gradient and the ``[V, H]`` weight gradient (float32; a bf16 weight's gradient is
rounded once at the end).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.entropy.blocks import (
    block_statistics,
    check_head_inputs,
    finish_statistics,
    merge_block,
    resolve_block,
    row_coefficients,
    scaled_block_logits,
)
from lit_entropy.functional.entropy.logits import EntropyStats
from lit_entropy.functional.entropy.numerics import X_FLOOR, check_temperature
from lit_entropy.functional.masked import compute_dtype

__all__ = ["LOSS_BLOCK", "linear_entropy_loss"]

#: ``(rows, vocab_cols)`` per device type: ``rows`` whose ``[rows, V]`` float32 logits are kept between the
#: statistics and the gradient step (CPU: 128 x 151,936 = 78 MB, 0.066x of the logits at N = 2048), and the
#: vocabulary columns of one block (CPU: 128 x 2048 float32 = 1 MiB, cache-resident like ``DEFAULT_BLOCK``'s
#: 256 x 1024; at N = 512, V = 151,936, H = 256, 1 thread this measured 2.5% faster than 1024 columns and 8%
#: slower than 256 rows, which would keep 0.13x of the logits).
LOSS_BLOCK: dict[str, tuple[int, int]] = {"cpu": (128, 2048), "default": (256, 4096)}

LossFn = Callable[[Tensor, Tensor], Tensor]


class _Workspace:
    """Buffers reused across row chunks (fresh per-chunk temporaries fragment the CPU heap)."""

    def __init__(self, h: Tensor, weight: Tensor, rows: int, cols: int, want_average: bool) -> None:
        vocab, cdt, dev = weight.shape[0], compute_dtype(h), h.device
        self.cols = cols
        self.logits = torch.empty(rows * vocab, dtype=cdt, device=dev)  # block-major: each block contiguous
        self.e = torch.empty(rows, cols, dtype=cdt, device=dev)
        self.t = torch.empty(rows, cols, dtype=cdt, device=dev)
        low = h.dtype != cdt
        # Matmul operands / outputs in the input dtype when it is narrower than the compute dtype.
        self.mm = torch.empty(rows, cols, dtype=h.dtype, device=dev) if low else None
        self.gh_tmp = torch.empty(rows, h.shape[1], dtype=h.dtype, device=dev) if low else None
        self.gw_tmp = torch.empty(cols, h.shape[1], dtype=h.dtype, device=dev) if low else None
        self.vec = torch.empty(8, rows, dtype=cdt, device=dev)
        self.state = torch.empty(5 if want_average else 3, rows, dtype=cdt, device=dev)
        self.block_max = torch.empty(-(-vocab // cols), rows, dtype=cdt, device=dev)

    def block(self, r: int, v0: int, v1: int) -> Tensor:
        """The contiguous ``[r, v1 - v0]`` logits block of vocabulary columns ``[v0, v1)``."""
        return self.logits[r * v0 : r * v1].view(r, v1 - v0)


class _Outputs:
    """Flat per-token outputs and the gradients, in the compute dtype."""

    def __init__(
        self, h: Tensor, weight: Tensor, bias: Tensor | None, want_average: bool, needs: tuple[bool, ...]
    ) -> None:
        n, cdt, dev = h.shape[0], compute_dtype(h), h.device
        self.logp, self.entropy, self.disc = (torch.zeros(n, dtype=cdt, device=dev) for _ in range(3))
        self.avg = torch.zeros(n, dtype=cdt, device=dev) if want_average else None
        need_h, need_w, need_b = needs
        self.gh = torch.zeros(n, h.shape[1], dtype=cdt, device=dev) if need_h else None
        self.gw = torch.zeros(weight.shape, dtype=cdt, device=dev) if need_w else None
        self.gb = torch.zeros(weight.shape[0], dtype=cdt, device=dev) if (need_b and bias is not None) else None

    @property
    def wants_grad(self) -> bool:
        return any(g is not None for g in (self.gh, self.gw, self.gb))


def _chunk_statistics(
    hb: Tensor, weight: Tensor, bias: Tensor | None, ids: Tensor, inv_t: float, ws: _Workspace, want_average: bool
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """Pass 1 over a row chunk: logits blocks into the workspace, streaming statistics; returns the finished
    ``(log p_k, H, S, E_p[S] | None, shift)`` of the chunk. Each stored block holds ``y = z / T - max_block``."""
    r, vocab, cols = hb.shape[0], weight.shape[0], ws.cols
    state, vec = ws.state[:, :r], ws.vec[:, :r]
    floor = X_FLOOR[ws.logits.dtype]
    for k, v0 in enumerate(range(0, vocab, cols)):
        v1 = min(v0 + cols, vocab)
        x, c = ws.block(r, v0, v1), v1 - v0
        wc, bc = weight[v0:v1], None if bias is None else bias[v0:v1]
        scaled_block_logits(hb, wc, bc, inv_t, x, None if ws.mm is None else ws.mm[:r, :c])
        block_statistics(x, ws.e[:r, :c], ws.t[:r, :c], vec, floor, want_average)
        ws.block_max[k, :r] = vec[0]
        if k == 0:
            state.copy_(vec[: state.shape[0]])
        else:
            merge_block(state, vec, want_average)
    return finish_statistics(hb, weight, bias, ids, inv_t, state, want_average)


def _token_grads(loss_fn: LossFn, out: _Outputs, shape: torch.Size) -> tuple[Tensor | None, Tensor | None]:
    """``(dL/dlog p, dL/dH)`` ``[N]`` of ``loss_fn`` at the current outputs (None where the loss ignores one)."""
    with torch.enable_grad():
        logp = out.logp.detach().view(shape).clone().requires_grad_()
        entropy = out.entropy.detach().view(shape).clone().requires_grad_()
        loss = _call_loss(loss_fn, logp, entropy)
        if not loss.requires_grad:
            return None, None
        g_lp, g_h = torch.autograd.grad(loss, (logp, entropy), allow_unused=True)
    return (None if g_lp is None else g_lp.reshape(-1)), (None if g_h is None else g_h.reshape(-1))


def _call_loss(loss_fn: LossFn, logp: Tensor, entropy: Tensor) -> Tensor:
    loss = loss_fn(logp, entropy)
    if not isinstance(loss, Tensor) or loss.dim() != 0:
        got = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
        raise ValueError(f"loss_fn must return a scalar tensor, got {got}")
    return loss


def _chunk_gradients(
    hb: Tensor,
    weight: Tensor,
    ids: Tensor,
    rows: slice,
    shift: Tensor,
    coefficients: tuple[Tensor | None, Tensor, Tensor | None],
    ws: _Workspace,
    out: _Outputs,
) -> None:
    """Pass 2 over a row chunk: turn each stored block into ``dL/dz`` and multiply it into the gradients."""
    a, b, c = coefficients
    r, vocab, cols = hb.shape[0], weight.shape[0], ws.cols
    floor = X_FLOOR[ws.logits.dtype]
    delta = ws.block_max[:, :r] - shift  # log p = y + (max_block - shift)
    a_col = None if a is None else a.unsqueeze(1)
    b_col = b.unsqueeze(1)
    gh = None if out.gh is None else out.gh[rows]
    mm, gh_tmp, gw_tmp = ws.mm, ws.gh_tmp, ws.gw_tmp  # all None or none (the input dtype is the compute dtype)
    for k, v0 in enumerate(range(0, vocab, cols)):
        v1 = min(v0 + cols, vocab)
        x, e = ws.block(r, v0, v1), ws.e[:r, : v1 - v0]
        x.add_(delta[k].unsqueeze(1)).clamp_(min=floor)  # x = log p, floored as in the forward
        torch.exp(x, out=e)
        if a_col is not None:
            x.mul_(a_col).add_(b_col).mul_(e)  # dL/dz without the sampled token's term
        else:
            torch.mul(e, b_col, out=x)
        if mm is None or gh_tmp is None or gw_tmp is None:
            if gh is not None:
                gh.addmm_(x, weight[v0:v1])
            if out.gw is not None:
                out.gw[v0:v1].addmm_(x.T, hb)
        else:
            g = mm[:r, : v1 - v0].copy_(x)
            if gh is not None:
                gh.add_(torch.mm(g, weight[v0:v1], out=gh_tmp[:r]))
            if out.gw is not None:
                out.gw[v0:v1].add_(torch.mm(g.T, hb, out=gw_tmp[: v1 - v0]))
        if out.gb is not None:
            out.gb[v0:v1] += x.sum(0)
    if c is None:
        return
    cdt = out.logp.dtype
    if gh is not None:
        gh.addcmul_(c.unsqueeze(1), weight[ids].to(cdt))
    if out.gw is not None:
        out.gw.index_add_(0, ids, c.unsqueeze(1) * hb.to(cdt))
    if out.gb is not None:
        out.gb.index_add_(0, ids, c)


def _loss_kernel(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    ids: Tensor,
    inv_t: float,
    rows: int,
    cols: int,
    want_average: bool,
    loss_fn: LossFn,
    shape: torch.Size,
    needs: tuple[bool, ...],
) -> _Outputs:
    n, vocab = h.shape[0], weight.shape[0]
    out = _Outputs(h, weight, bias, want_average, needs)
    if n == 0:
        return out
    rows, cols = min(rows, n), min(cols, vocab)
    ws = _Workspace(h, weight, rows, cols, want_average)
    for r0 in range(0, n, rows):
        sl = slice(r0, min(r0 + rows, n))
        hb = h[sl]
        logp, entropy, disc, avg, shift = _chunk_statistics(hb, weight, bias, ids[sl], inv_t, ws, want_average)
        out.logp[sl], out.entropy[sl], out.disc[sl] = logp, entropy, disc
        if out.avg is not None and avg is not None:
            out.avg[sl] = avg
        if not out.wants_grad:
            continue
        g_lp, g_h = _token_grads(loss_fn, out, shape)
        if g_lp is None and g_h is None:
            continue
        coefficients = row_coefficients(
            entropy, None if g_lp is None else g_lp[sl], None if g_h is None else g_h[sl], inv_t, out.logp.dtype
        )
        _chunk_gradients(hb, weight, ids[sl], sl, shift, coefficients, ws, out)
    return out


class _LinearEntropyLossFn(torch.autograd.Function):
    """Blockwise LM head + per-token loss; the gradient is formed in the forward, the backward scales it."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: Tensor,
        weight: Tensor,
        bias: Tensor | None,
        ids: Tensor,
        inv_t: float,
        rows: int,
        cols: int,
        want_average: bool,
        loss_fn: LossFn,
        shape: torch.Size,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        needs = tuple(ctx.needs_input_grad[:3])
        out = _loss_kernel(hidden, weight, bias, ids, inv_t, rows, cols, want_average, loss_fn, shape, needs)
        loss = _call_loss(loss_fn, out.logp.view(shape), out.entropy.view(shape)).detach()
        ctx.grads = (
            None if out.gh is None else out.gh.to(hidden.dtype),
            None if out.gw is None else out.gw.to(weight.dtype),
            None if out.gb is None or bias is None else out.gb.to(bias.dtype),
        )
        avg = out.avg if out.avg is not None else out.logp.new_empty(0)
        ctx.mark_non_differentiable(out.logp, out.entropy, out.disc, avg)
        return loss, out.logp, out.entropy, out.disc, avg

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_loss: Tensor | None, *_unused: Tensor | None) -> tuple[Tensor | None, ...]:
        grads, ctx.grads = ctx.grads, None
        if grads is None:
            raise RuntimeError(
                "linear_entropy_loss: backward ran a second time through one call (retain_graph=True); its gradient "
                "is formed in the forward and handed over once: call linear_entropy_loss again instead"
            )
        if grad_loss is None:
            return (None,) * 10
        # Handing our only reference over lets autograd adopt the [V, H] weight gradient as `.grad` instead of
        # copying it; an incoming gradient of 1 (the loss back-propagated as is) needs no scaling.
        one = bool(grad_loss == 1)
        scaled = [None if g is None else (g if one else g.mul_(grad_loss)) for g in grads]
        del grads
        return (*scaled, None, None, None, None, None, None, None)


def linear_entropy_loss(
    hidden: Tensor,
    weight: Tensor,
    token_ids: Tensor,
    loss_fn: LossFn,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    policy_average: bool = False,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
) -> tuple[Tensor, EntropyStats]:
    """``loss_fn(log p_k, H)`` of the policy ``softmax((hidden @ weight.T + bias) / T)``, and the statistics, in
    one pass over the logits (never materialised) that also forms the loss's gradient.

    Args:
        hidden: ``[..., H]`` final hidden states of the positions that predict ``token_ids``.
        weight: ``[V, H]`` LM-head weight, same dtype as ``hidden`` (may be the tied input embedding).
        token_ids: ``[...]`` integer ids of the sampled tokens, values in ``[0, V)``.
        loss_fn: maps ``(logprobs, entropy)``, each ``hidden.shape[:-1]`` float32 (float64 for float64 inputs),
            to a scalar that is a sum of per-token terms (see the module docstring); called once per row chunk.
        bias: optional ``[V]`` LM-head bias.
        temperature: ``T > 0``.
        policy_average: also compute ``E_p[S]``.
        chunk_size: rows whose ``[rows, V]`` logits are kept at a time (``None``: ``LOSS_BLOCK`` of the device).
        vocab_chunk_size: vocabulary entries per block (``None``: ``LOSS_BLOCK``).

    Returns:
        ``(loss, stats)``: the scalar loss, differentiable w.r.t. ``hidden``, ``weight`` and ``bias`` (the
        gradient was computed here; backward only scales it), and the detached
        :class:`~lit_entropy.functional.entropy.logits.EntropyStats` (``[...]`` each).
    """
    check_head_inputs(hidden, weight, token_ids, bias)
    if not callable(loss_fn):
        raise ValueError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
    inv_t = 1.0 / check_temperature(temperature)
    kind = hidden.device.type
    d_rows, d_cols = LOSS_BLOCK.get(kind, LOSS_BLOCK["default"])
    rows = resolve_block("chunk_size", chunk_size, d_rows)
    cols = resolve_block("vocab_chunk_size", vocab_chunk_size, d_cols)
    shape = hidden.shape[:-1]
    h2 = hidden.reshape(-1, hidden.shape[-1])
    ids = token_ids.reshape(-1).to(torch.long)
    args = (ids, inv_t, rows, cols, policy_average, loss_fn, shape)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        # torch types Function.apply without annotations.
        loss, logp, entropy, disc, avg = _LinearEntropyLossFn.apply(h2, weight, bias, *args)  # type: ignore[no-untyped-call]
    else:
        with torch.no_grad():
            out = _loss_kernel(h2, weight, bias, *args, (False, False, False))
            loss = _call_loss(loss_fn, out.logp.view(shape), out.entropy.view(shape))
        logp, entropy, disc, avg = out.logp, out.entropy, out.disc, out.avg
    stats = EntropyStats(
        logprobs=logp.view(shape),
        entropy=entropy.view(shape),
        discriminator=disc.view(shape),
        policy_average=avg.view(shape) if policy_average else None,
    )
    return loss, stats

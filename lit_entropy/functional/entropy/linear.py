"""Entropy statistics straight from hidden states and the LM head: logits are never materialised.

``linear_entropy_stats(h, W, k)`` returns what ``entropy_stats(h @ W.T + b, k)`` returns (THEORY.md
sections 1-2: log-prob of the sampled token, entropy in nats, discriminator ``S_k = p_k (H + log p_k)``
and the policy average ``E_p[S]``) without the ``[N, V]`` logits tensor or its gradient.

How: the logits are computed one block of ``[rows, vocab_cols]`` at a time (one matmul per block)
and reduced with an online (streaming) log-sum-exp: per row we keep the running max ``M`` and, relative
to it, ``Z = sum e``, ``A = sum e y``, ``B = sum e^2`` and ``C = sum e^2 y`` (``y = z / T - M``,
``e = exp(y)``), rescaled whenever ``M`` grows. At the end ``H = log Z - A / Z`` and
``E_p[S] = C / Z^2 - (B / Z^2)(A / Z)``. The backward pass recomputes each block's logits once, forms
the logits gradient ``g = p (a log p + b)`` (``a = -dL/dH / T``, ``b = a H - dL/dlog p_k / T``) in the
block and immediately multiplies it into the hidden-state and weight gradients; the sampled token's
``e_k`` term is added separately (a gather and an ``index_add``), so no scatter runs per block.

Rows whose log-prob and entropy both get a zero gradient (loss-masked tokens, groups whose advantages are all
zero) add nothing to any gradient, so the backward runs over the other rows only.

Loop order is vocabulary-outer, rows-inner: each weight chunk's gradient is finished (summed over all
rows in a small float32 accumulator) and written once, so a bf16 weight needs no ``[V, H]`` float32
accumulator; the hidden-state gradient ``[N, H]`` (tiny next to ``[N, V]``) accumulates across chunks.
Matmuls run in the input dtype, exactly like the model's own LM head, so the blockwise and the full-logits
paths see the same (bf16-rounded) logits; all softmax arithmetic is float32 (float64 for float64).

Memory (float32, N rows, V vocabulary, H hidden): two ``[rows, vocab_cols]`` blocks, ``O(N)`` per-row
scalars, the ``[N, H]`` hidden-state gradient and the weight gradient ``[V, H]`` (which any head needs).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from lit_entropy.functional.entropy.blocks import (
    block_logits,
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

__all__ = ["DEFAULT_BLOCK", "linear_entropy_stats"]

#: Default ``(rows, vocab_cols)`` of one logits block per device type. CPU: a float32 block of 1 MiB
#: keeps the elementwise passes cache-resident while the block matmul ``[rows, H] @ [H, vocab_cols]``
#: runs at full BLAS speed (measured on 1 AVX2 core: 256x1024, 512x512 and 2048x128 within 3% of each
#: other, 64x4096 30% slower). Accelerators want large blocks to amortise kernel launches; 1024x4096
#: float32 is 16 MiB per buffer (three buffers: 0.04x of the logits at N = 2048, V = 151936).
DEFAULT_BLOCK: dict[str, tuple[int, int]] = {"cpu": (256, 1024), "default": (1024, 4096)}


class _Buffers:
    """Reusable per-block buffers (fresh per-block temporaries fragment the CPU heap)."""

    def __init__(
        self, rows: int, cols: int, mm_dtype: torch.dtype, cdt: torch.dtype, device: torch.device, *, forward: bool
    ) -> None:
        self.x = torch.empty(rows, cols, dtype=cdt, device=device)
        self.e = torch.empty(rows, cols, dtype=cdt, device=device)
        # The forward pass's third block and per-row scalars of one block (the backward needs neither).
        self.t = torch.empty(rows, cols, dtype=cdt, device=device) if forward else None
        self.vec = torch.empty(8, rows, dtype=cdt, device=device) if forward else None
        # Matmul output / input in the input dtype when it is narrower than the compute dtype.
        self.mm = None if mm_dtype == cdt else torch.empty(rows, cols, dtype=mm_dtype, device=device)


def _forward_kernel(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    ids: Tensor,
    inv_t: float,
    rows: int,
    cols: int,
    want_average: bool,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor]:
    """Streaming pass over ``[rows, cols]`` logits blocks. Returns flat ``(log p_k, H, S, E_p[S] | None, shift)``.

    ``shift = M + log Z`` per row, so that ``log p = z / T - shift`` (used by the backward pass).
    """
    n = h.shape[0]
    vocab = weight.shape[0]
    cdt = compute_dtype(h)
    dev = h.device
    floor = X_FLOOR[cdt]
    # Running per-row state relative to the running max m (in units of z / T).
    state = torch.empty(5 if want_average else 3, n, dtype=cdt, device=dev)
    if n == 0:
        empty = state[0].clone()
        return empty, empty.clone(), empty.clone(), empty.clone() if want_average else None, empty.clone()
    rows, cols = min(rows, n), min(cols, vocab)
    buf = _Buffers(rows, cols, h.dtype, cdt, dev, forward=True)
    t_buf, vec_buf = buf.t, buf.vec
    assert t_buf is not None and vec_buf is not None  # allocated by forward=True
    for v0 in range(0, vocab, cols):
        v1 = min(v0 + cols, vocab)
        wc = weight[v0:v1]
        bc = None if bias is None else bias[v0:v1]
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            r, c = r1 - r0, v1 - v0
            x, e = buf.x[:r, :c], buf.e[:r, :c]
            scaled_block_logits(h[r0:r1], wc, bc, inv_t, x, None if buf.mm is None else buf.mm[:r, :c])
            vec = vec_buf[:, :r]
            block_statistics(x, e, t_buf[:r, :c], vec, floor, want_average)
            sl = slice(r0, r1)
            if v0 == 0:
                state[:, sl] = vec[: state.shape[0]]
            else:
                merge_block(state[:, sl], vec, want_average)
    return finish_statistics(h, weight, bias, ids, inv_t, state, want_average)


def _backward_kernel(
    h: Tensor,
    weight: Tensor,
    bias: Tensor | None,
    ids: Tensor,
    shift: Tensor,
    entropy: Tensor,
    grad_logp: Tensor | None,
    grad_h: Tensor | None,
    inv_t: float,
    rows: int,
    cols: int,
    needs: tuple[bool, bool, bool],
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients w.r.t. ``(hidden, weight, bias)`` (None where not needed), one logits recompute per block."""
    n, hidden_size = h.shape
    vocab, cdt, dev = weight.shape[0], compute_dtype(h), h.device
    need_h, need_w, need_b = needs
    need_b = need_b and bias is not None
    a, b, c = row_coefficients(entropy, grad_logp, grad_h, inv_t, cdt)
    gh = torch.zeros(n, hidden_size, dtype=cdt, device=dev) if need_h else None
    gw = torch.empty_like(weight) if need_w else None
    gb = torch.empty_like(bias) if need_b and bias is not None else None
    if n == 0:
        return (
            None if gh is None else gh.to(h.dtype),
            None if gw is None else gw.zero_(),
            None if gb is None else gb.zero_(),
        )
    rows, cols = min(rows, n), min(cols, vocab)
    buf = _Buffers(rows, cols, h.dtype, cdt, dev, forward=False)
    acc = _ChunkAccumulators(cols, rows, hidden_size, h.dtype, cdt, dev, need_h, need_w, need_b, buf.mm is not None)
    tokens = _TokenTerms(ids, c, h, vocab, cols, need_w) if c is not None and (need_w or need_b) else None
    neg_shift = shift.neg().unsqueeze(1)
    for k, v0 in enumerate(range(0, vocab, cols)):
        v1 = min(v0 + cols, vocab)
        wc, bc = weight[v0:v1], None if bias is None else bias[v0:v1]
        gwc, gbc = acc.start_chunk(v1 - v0)
        for r0 in range(0, n, rows):
            r1 = min(r0 + rows, n)
            hb = h[r0:r1]
            g = _block_dlogits(hb, wc, bc, neg_shift[r0:r1], buf, inv_t, a, b, r0, r1)
            g_exact = buf.x[: r1 - r0, : v1 - v0]
            acc.add_block(g, g_exact, hb, wc, None if gh is None else gh[r0:r1], gwc, gbc)
        if tokens is not None:
            tokens.add_chunk(k, v0, gwc, gbc)
        if gw is not None and gwc is not None:
            gw[v0:v1].copy_(gwc)
        if gb is not None and gbc is not None:
            gb[v0:v1].copy_(gbc)
    if gh is not None:
        if c is not None:
            gh.addcmul_(c.unsqueeze(1), weight[ids].to(cdt))
        gh = gh.to(h.dtype)
    return gh, gw, gb


def _block_dlogits(
    hb: Tensor,
    wc: Tensor,
    bc: Tensor | None,
    neg_shift: Tensor,
    buf: _Buffers,
    inv_t: float,
    a: Tensor | None,
    b: Tensor,
    r0: int,
    r1: int,
) -> Tensor:
    """``dL/dz`` of one recomputed logits block without the ``e_k`` term (in the matmul dtype)."""
    r, cw = r1 - r0, wc.shape[0]
    x, e = buf.x[:r, :cw], buf.e[:r, :cw]
    mm = None if buf.mm is None else buf.mm[:r, :cw]
    logits = block_logits(hb, wc, bc, out=x if mm is None else mm)
    torch.add(neg_shift, logits, alpha=inv_t, out=x)  # x = log p
    x.clamp_(min=X_FLOOR[x.dtype])  # same floor as the forward: p < 4e-18 there, no denormals
    torch.exp(x, out=e)  # e = p
    if a is not None:
        # Three in-place passes beat one broadcasting addcmul by ~25% on CPU (measured).
        x.mul_(a[r0:r1].unsqueeze(1)).add_(b[r0:r1].unsqueeze(1)).mul_(e)
    else:
        torch.mul(e, b[r0:r1].unsqueeze(1), out=x)
    return x if mm is None else mm.copy_(x)


class _ChunkAccumulators:
    """Preallocated gradient accumulators of one vocabulary chunk (weight / bias) and matmul scratch."""

    def __init__(
        self,
        cols: int,
        rows: int,
        hidden_size: int,
        mm_dtype: torch.dtype,
        cdt: torch.dtype,
        dev: torch.device,
        need_h: bool,
        need_w: bool,
        need_b: bool,
        low: bool,
    ) -> None:
        self.gw = torch.empty(cols, hidden_size, dtype=cdt, device=dev) if need_w else None
        self.gb = torch.empty(cols, dtype=cdt, device=dev) if need_b else None
        self.gb_tmp = torch.empty(cols, dtype=cdt, device=dev) if need_b else None
        self.gh_tmp = torch.empty(rows, hidden_size, dtype=mm_dtype, device=dev) if (need_h and low) else None
        self.gw_tmp = torch.empty(cols, hidden_size, dtype=mm_dtype, device=dev) if (need_w and low) else None

    def start_chunk(self, width: int) -> tuple[Tensor | None, Tensor | None]:
        gw = None if self.gw is None else self.gw[:width].zero_()
        gb = None if self.gb is None else self.gb[:width].zero_()
        return gw, gb

    def add_block(
        self,
        g: Tensor,
        g_exact: Tensor,
        hb: Tensor,
        wc: Tensor,
        gh: Tensor | None,
        gw: Tensor | None,
        gb: Tensor | None,
    ) -> None:
        """Add one block's ``g @ W_c`` to ``gh``, ``g.T @ h_b`` to ``gw`` and the column sums of ``g_exact`` (``g``
        in the compute dtype) to ``gb``."""
        r, cw = g.shape
        if gh is not None:
            if self.gh_tmp is not None:  # low precision: the product in the matmul dtype, then added
                gh.add_(torch.mm(g, wc, out=self.gh_tmp[:r]))
            else:
                gh.addmm_(g, wc)
        if gw is not None:
            if self.gw_tmp is not None:
                gw.add_(torch.mm(g.T, hb, out=self.gw_tmp[:cw]))
            else:
                gw.addmm_(g.T, hb)
        if gb is not None and self.gb_tmp is not None:
            gb.add_(torch.sum(g_exact, dim=0, out=self.gb_tmp[:cw]))


class _TokenTerms:
    """The ``c e_k`` terms of ``dL/dz`` for the weight / bias gradients, rows grouped by sampled token so that
    each vocabulary chunk's terms are one contiguous range."""

    def __init__(self, ids: Tensor, c: Tensor, h: Tensor, vocab: int, cols: int, need_w: bool) -> None:
        order = torch.argsort(ids)
        self.sorted_ids = ids[order]
        starts = torch.arange(0, vocab + cols, cols, device=ids.device).clamp_(max=vocab)
        self.bounds = torch.searchsorted(self.sorted_ids, starts).tolist()  # one host sync per backward
        self.src = (c.unsqueeze(1) * h.to(c.dtype))[order] if need_w else None
        self.c_sorted = c[order]

    def add_chunk(self, k: int, v0: int, gw: Tensor | None, gb: Tensor | None) -> None:
        lo, hi = self.bounds[k], self.bounds[k + 1]
        if hi > lo:
            local = self.sorted_ids[lo:hi] - v0
            if gw is not None and self.src is not None:
                gw.index_add_(0, local, self.src[lo:hi])
            if gb is not None:
                gb.index_add_(0, local, self.c_sorted[lo:hi])


def _active_rows(grad_logp: Tensor | None, grad_h: Tensor | None) -> Tensor | None:
    """Indices of the rows whose log-prob or entropy has a nonzero (or NaN) gradient; None when every row has one.

    One host sync per backward.
    """
    nonzero: Tensor | None = None
    for grad in (grad_logp, grad_h):
        if grad is not None:
            row = grad.reshape(-1) != 0
            nonzero = row if nonzero is None else nonzero | row
    if nonzero is None or bool(nonzero.all()):
        return None
    return nonzero.nonzero().squeeze(1)


class _LinearEntropyStatsFn(torch.autograd.Function):
    """Blockwise LM head + softmax statistics; the backward recomputes each logits block once."""

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
    ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        logp, h, s, avg, shift = _forward_kernel(hidden, weight, bias, ids, inv_t, rows, cols, want_average)
        if avg is None:
            avg = s.new_empty(0)
        ctx.save_for_backward(hidden, weight, bias, ids, shift, h)
        ctx.inv_t, ctx.rows, ctx.cols = inv_t, rows, cols
        ctx.mark_non_differentiable(s, avg)
        ctx.set_materialize_grads(False)
        return logp, h, s, avg

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(
        ctx: Any, grad_logp: Tensor | None, grad_h: Tensor | None, _grad_s: Tensor | None, _grad_avg: Tensor | None
    ) -> tuple[Tensor | None, ...]:
        needs = tuple(ctx.needs_input_grad[:3])
        if not any(needs) or (grad_logp is None and grad_h is None):
            return None, None, None, None, None, None, None, None
        hidden, weight, bias, ids, shift, h = ctx.saved_tensors
        active = _active_rows(grad_logp, grad_h)
        if active is None:
            gh, gw, gb = _backward_kernel(
                hidden, weight, bias, ids, shift, h, grad_logp, grad_h, ctx.inv_t, ctx.rows, ctx.cols, needs
            )
            return gh, gw, gb, None, None, None, None, None
        # Rows whose outputs get no gradient (loss-masked tokens, zero-advantage groups) add exactly zero to every
        # gradient: the backward's three head-sized matmuls run over the other rows only.

        def pick(t: Tensor | None) -> Tensor | None:
            return None if t is None else t.reshape(-1)[active]

        gh_active, gw, gb = _backward_kernel(
            hidden[active], weight, bias, ids[active], shift[active], h[active], pick(grad_logp), pick(grad_h),
            ctx.inv_t, ctx.rows, ctx.cols, needs,
        )  # fmt: skip
        gh = None if gh_active is None else hidden.new_zeros(hidden.shape).index_copy_(0, active, gh_active)
        return gh, gw, gb, None, None, None, None, None


def linear_entropy_stats(
    hidden: Tensor,
    weight: Tensor,
    token_ids: Tensor,
    *,
    bias: Tensor | None = None,
    temperature: float = 1.0,
    policy_average: bool = False,
    chunk_size: int | None = None,
    vocab_chunk_size: int | None = None,
) -> EntropyStats:
    """``entropy_stats(hidden @ weight.T + bias, token_ids)`` without materialising the ``[..., V]`` logits.

    Args:
        hidden: ``[..., H]`` final hidden states (after the model's last norm) of the positions that
            predict ``token_ids``; float32/bf16/fp16/float64.
        weight: ``[V, H]`` LM-head weight, same dtype as ``hidden`` (may be the tied input embedding).
        token_ids: ``[...]`` integer ids of the sampled tokens, values in ``[0, V)``.
        bias: optional ``[V]`` LM-head bias.
        temperature: ``T > 0``; the policy is ``softmax(logits / T)``.
        policy_average: also compute ``E_p[S]`` (two extra dot products per block row).
        chunk_size: rows per logits block (``None``: ``DEFAULT_BLOCK`` of the device).
        vocab_chunk_size: vocabulary entries per logits block (``None``: ``DEFAULT_BLOCK``).

    Returns:
        :class:`~lit_entropy.functional.entropy.logits.EntropyStats`, each field ``[...]`` in float32 (float64
        for float64 inputs). ``logprobs`` and ``entropy`` carry gradients to ``hidden``, ``weight`` and
        ``bias``; ``discriminator`` and ``policy_average`` are detached.
    """
    check_head_inputs(hidden, weight, token_ids, bias)
    inv_t = 1.0 / check_temperature(temperature)
    kind = hidden.device.type
    d_rows, d_cols = DEFAULT_BLOCK.get(kind, DEFAULT_BLOCK["default"])
    rows = resolve_block("chunk_size", chunk_size, d_rows)
    cols = resolve_block("vocab_chunk_size", vocab_chunk_size, d_cols)
    shape = hidden.shape[:-1]
    h2 = hidden.reshape(-1, hidden.shape[-1])
    ids = token_ids.reshape(-1).to(torch.long)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (hidden, weight, bias)):
        # torch types Function.apply without annotations.
        logp, h, s, avg = _LinearEntropyStatsFn.apply(  # type: ignore[no-untyped-call]
            h2, weight, bias, ids, inv_t, rows, cols, policy_average
        )
        avg = avg if policy_average else None
    else:
        with torch.no_grad():
            logp, h, s, avg, _ = _forward_kernel(h2, weight, bias, ids, inv_t, rows, cols, policy_average)
    return EntropyStats(
        logprobs=logp.view(shape),
        entropy=h.view(shape),
        discriminator=s.view(shape),
        policy_average=None if avg is None else avg.view(shape),
    )

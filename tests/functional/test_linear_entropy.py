"""Tests of lit_entropy.functional.entropy.linear (blockwise LM head + entropy statistics).

Reference: the full-logits float64 computation (full logits ``h @ W.T + b``, ``/ T``, ``log_softmax``)
differentiated by torch.autograd, and central finite differences (``gradcheck``).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lit_entropy.functional import linear_entropy_stats


def reference(hidden, weight, ids, bias=None, temperature=1.0):
    """Float64 ``(log p_k, H, S_k, E_p[S])`` from full logits; differentiable w.r.t. the float64 inputs."""
    z = hidden.double() @ weight.double().T
    if bias is not None:
        z = z + bias.double()
    lp = torch.log_softmax(z / temperature, dim=-1)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    lk = lp.gather(-1, ids.unsqueeze(-1)).squeeze(-1)
    s = lk.exp() * (h + lk)
    avg = h * (p * p).sum(-1) + (p * p * lp).sum(-1)
    return lk, h, s, avg


def _inputs(n, vocab, hidden, *, dtype=torch.float64, bias=False, seed=0, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, hidden, generator=gen, dtype=torch.float64)
    w = torch.randn(vocab, hidden, generator=gen, dtype=torch.float64) * scale
    b = torch.randn(vocab, generator=gen, dtype=torch.float64) if bias else None
    ids = torch.randint(0, vocab, (n,), generator=gen)
    cast = lambda t: None if t is None else t.to(dtype).requires_grad_(True)  # noqa: E731
    return cast(h), cast(w), cast(b), ids


def _loss_weights(shape, seed=7):
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(
        shape, generator=gen, dtype=torch.float64
    )


def _grads(loss, tensors):
    leaves = [t for t in tensors if t is not None]
    got = torch.autograd.grad(loss, leaves)
    it = iter(got)
    return [None if t is None else next(it) for t in tensors]


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.6])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize(("rows", "cols"), [(5, 7), (3, 64), (64, 4), (37, 53)])
def test_values_and_gradients_match_full_logits_float64(temperature, use_bias, rows, cols) -> None:
    # 37 rows x 53 vocabulary: none of the block sizes divides both (except the single block).
    h, w, b, ids = _inputs(37, 53, 6, bias=use_bias, scale=2.0)
    out = linear_entropy_stats(
        h, w, ids, bias=b, temperature=temperature, policy_average=True, chunk_size=rows, vocab_chunk_size=cols
    )
    ref = reference(h, w, ids, b, temperature)
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    w_lp, w_h = _loss_weights(37)
    got = _grads((w_lp * out.logprobs + w_h * out.entropy).sum(), (h, w, b))
    want = _grads((w_lp * ref[0] + w_h * ref[1]).sum(), (h, w, b))
    for g, r in zip(got, want, strict=True):
        if r is not None:
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("pick", ["logprobs", "entropy"])
def test_one_output_used_and_policy_average_off(pick) -> None:
    h, w, b, ids = _inputs(11, 29, 5, bias=True, seed=3)
    out = linear_entropy_stats(h, w, ids, bias=b, temperature=0.9, chunk_size=4, vocab_chunk_size=8)
    assert out.policy_average is None
    ref = reference(h, w, ids, b, 0.9)
    got = _grads(getattr(out, pick).sum(), (h, w, b))
    want = _grads((ref[0] if pick == "logprobs" else ref[1]).sum(), (h, w, b))
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_rows_without_gradient_are_skipped_in_backward(monkeypatch) -> None:
    import lit_entropy.functional.entropy.linear as le

    h, w, b, ids = _inputs(13, 29, 5, bias=True, seed=5)
    w_lp, w_h = _loss_weights(13)
    idle = [0, 3, 4, 12]  # e.g. loss-masked tokens or a zero-advantage group: no gradient at all
    w_lp[idle] = 0.0
    w_h[idle] = 0.0
    w_h[5] = 0.0  # a log-prob gradient only: still a row of the backward
    w_lp[6] = 0.0  # an entropy gradient only: idem
    seen = []
    kernel = le._backward_kernel
    monkeypatch.setattr(le, "_backward_kernel", lambda hidden, *a: seen.append(hidden.shape[0]) or kernel(hidden, *a))
    for weights, rows in (((w_lp, w_h), 9), ((w_lp * 0, w_h * 0), 0)):
        out = linear_entropy_stats(h, w, ids, bias=b, temperature=0.8, chunk_size=4, vocab_chunk_size=8)
        ref = reference(h, w, ids, b, 0.8)
        got = _grads((weights[0] * out.logprobs + weights[1] * out.entropy).sum(), (h, w, b))
        want = _grads((weights[0] * ref[0] + weights[1] * ref[1]).sum(), (h, w, b))
        assert seen.pop() == rows
        for g, r in zip(got, want, strict=True):
            torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
        assert bool((got[0][idle] == 0).all())


def test_float32_matches_float64_reference() -> None:
    h, w, b, ids = _inputs(70, 300, 16, dtype=torch.float32, bias=True, seed=5, scale=0.7)
    out = linear_entropy_stats(
        h, w, ids, bias=b, temperature=0.8, policy_average=True, chunk_size=16, vocab_chunk_size=48
    )
    h64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (h, w, b))
    ref = reference(h64, w64, ids, b64, 0.8)
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=2e-6)
    w_lp, w_h = _loss_weights(70)
    got = _grads((w_lp.float() * out.logprobs + w_h.float() * out.entropy).sum(), (h, w, b))
    want = _grads((w_lp * ref[0] + w_h * ref[1]).sum(), (h64, w64, b64))
    for g, r in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-5)


def test_leading_dims_and_padded_rows() -> None:
    # [B, T, H] hidden states; padded positions carry a valid id but are masked out of the loss.
    h, w, _, ids = _inputs(12, 31, 4, seed=8)
    h3 = h.detach().view(3, 4, 4).requires_grad_(True)
    ids3 = ids.view(3, 4)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    out = linear_entropy_stats(h3, w, ids3, temperature=1.3, policy_average=True, chunk_size=5, vocab_chunk_size=6)
    assert all(t.shape == (3, 4) for t in out)
    ref = reference(h3, w, ids3, None, 1.3)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    got = _grads((mask * (out.logprobs - 0.1 * out.entropy)).sum(), (h3, w))
    want = _grads((mask * (ref[0] - 0.1 * ref[1])).sum(), (h3, w))
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    assert torch.all(got[0][mask == 0] == 0)


def test_tied_embedding_gradients_accumulate() -> None:
    # The head weight is the input embedding: its gradient is the sum of both uses.
    vocab, hid = 23, 5
    gen = torch.Generator().manual_seed(4)
    emb = torch.randn(vocab, hid, generator=gen, dtype=torch.float64, requires_grad=True)
    mix = torch.randn(hid, hid, generator=gen, dtype=torch.float64, requires_grad=True)
    inp = torch.randint(0, vocab, (9,), generator=gen)
    ids = torch.randint(0, vocab, (9,), generator=gen)

    def run(blockwise: bool):
        hidden = torch.tanh(emb[inp] @ mix)
        if blockwise:
            out = linear_entropy_stats(hidden, emb, ids, temperature=0.8, chunk_size=2, vocab_chunk_size=5)
            lk, h = out.logprobs, out.entropy
        else:
            lk, h, _, _ = reference(hidden, emb, ids, None, 0.8)
        return torch.autograd.grad((lk + 0.3 * h).sum(), (emb, mix))

    for g, r in zip(run(True), run(False), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_frozen_head_and_hidden_only_gradient() -> None:
    h, w, _, ids = _inputs(8, 19, 3, seed=6)
    w = w.detach()  # e.g. LoRA: the head is frozen, no weight gradient is computed
    out = linear_entropy_stats(h, w, ids, chunk_size=3, vocab_chunk_size=4)
    (g,) = torch.autograd.grad(out.logprobs.sum(), h)
    lk, _, _, _ = reference(h, w, ids)
    (r,) = torch.autograd.grad(lk.sum(), h)
    torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.6])
def test_gradcheck_finite_differences(temperature) -> None:
    h, w, b, ids = _inputs(5, 9, 3, bias=True, seed=2)

    def fn(hh, ww, bb):
        out = linear_entropy_stats(hh, ww, ids, bias=bb, temperature=temperature, chunk_size=2, vocab_chunk_size=4)
        return out.logprobs, out.entropy

    assert torch.autograd.gradcheck(fn, (h, w, b), eps=1e-6, atol=1e-7, rtol=1e-6)


def test_bf16_inputs_give_float32_stats_and_bf16_gradients() -> None:
    h, w, b, ids = _inputs(24, 80, 16, dtype=torch.bfloat16, bias=True, seed=9, scale=0.5)
    out = linear_entropy_stats(
        h, w, ids, bias=b, temperature=0.9, policy_average=True, chunk_size=7, vocab_chunk_size=16
    )
    h64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (h, w, b))
    ref = reference(h64, w64, ids, b64, 0.9)
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float32
        # bf16 logits carry a relative rounding error of 2^-9 (the matmul runs in bf16, like the model's head).
        torch.testing.assert_close(got.double(), want.detach(), rtol=2e-2, atol=2e-2)
    got = _grads((out.logprobs + 0.5 * out.entropy).sum(), (h, w, b))
    want = _grads((ref[0] + 0.5 * ref[1]).sum(), (h64, w64, b64))
    for g, r in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        scale = r.abs().max()
        torch.testing.assert_close(g.double() / scale, r / scale, rtol=0, atol=3e-2)


def test_large_logits_are_stable_and_no_grad_path_agrees() -> None:
    # Logits spread over ~+-200: exp() must neither overflow nor produce NaN/denormal trouble.
    h, w, _, ids = _inputs(10, 40, 4, dtype=torch.float32, seed=1, scale=60.0)
    with torch.no_grad():
        plain = linear_entropy_stats(h, w, ids, policy_average=True, chunk_size=3, vocab_chunk_size=7)
    out = linear_entropy_stats(h, w, ids, policy_average=True, chunk_size=3, vocab_chunk_size=7)
    ref = reference(h.detach(), w.detach(), ids)
    for a, g, want in zip(plain, out, ref, strict=True):
        torch.testing.assert_close(a, g.detach(), rtol=0, atol=0)
        torch.testing.assert_close(a.double(), want, rtol=1e-4, atol=1e-4)
    assert torch.isfinite(torch.autograd.grad(out.entropy.sum() + out.logprobs.sum(), w)[0]).all()


def test_empty_input() -> None:
    h = torch.zeros(0, 3, requires_grad=True)
    w = torch.randn(7, 3, requires_grad=True)
    out = linear_entropy_stats(h, w, torch.zeros(0, dtype=torch.long), policy_average=True)
    assert all(t.shape == (0,) for t in out)
    gh, gw = torch.autograd.grad(out.logprobs.sum() + out.entropy.sum(), (h, w), allow_unused=True)
    assert gh is None or gh.shape == (0, 3)
    assert gw is None or torch.all(gw == 0)


class _AllocationRecorder(TorchDispatchMode):
    """Records the byte size of every tensor storage an aten op creates (not views, not ``out=`` buffers)."""

    def __init__(self):
        super().__init__()
        self.largest = 0
        self.total = 0
        self.sizes: list[int] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        inputs = set()
        for a in torch.utils._pytree.tree_leaves((args, kwargs)):
            if isinstance(a, torch.Tensor):
                inputs.add(a.untyped_storage().data_ptr())
        out = func(*args, **kwargs)
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs:
                nbytes = o.untyped_storage().nbytes()
                self.largest = max(self.largest, nbytes)
                self.total += nbytes
                self.sizes.append(nbytes)
        return out


def test_memory_is_bounded_by_the_block_not_by_rows_times_vocab() -> None:
    # N x V = 120 x 960 logits (461 kB float32) vs a 40 x 240 block: every tensor created in the forward
    # and backward must be at most one of: the block, the weight gradient [V, H], per-row [N, H].
    # (Few blocks: the dispatch mode costs ~1 ms per op.)
    n, vocab, hid, rows, cols = 120, 960, 4, 40, 240
    h, w, b, ids = _inputs(n, vocab, hid, dtype=torch.float32, bias=True, seed=3)
    bound = 4 * max(rows * cols, vocab * hid, n * hid)
    rec = _AllocationRecorder()
    with rec:
        out = linear_entropy_stats(h, w, ids, bias=b, policy_average=True, chunk_size=rows, vocab_chunk_size=cols)
        (out.logprobs.sum() + out.entropy.sum()).backward()
    logits_bytes = 4 * n * vocab
    assert 0 < rec.largest <= bound < logits_bytes / 10
    # The recorder sees allocations: the full-logits computation creates [N, V] tensors.
    ref_rec = _AllocationRecorder()
    with ref_rec:
        (h.detach() @ w.detach().T).log_softmax(-1)
    assert ref_rec.largest >= logits_bytes

    # Nothing vocabulary-sized is saved for the backward pass besides the weight (and bias) themselves.
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        linear_entropy_stats(h, w, ids, bias=b, chunk_size=rows, vocab_chunk_size=cols)
    big = [t for t in saved if t.numel() >= vocab]
    assert {t.data_ptr() for t in big} <= {w.data_ptr(), b.data_ptr()}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"temperature": 0.0}, "temperature"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"vocab_chunk_size": -3}, "vocab_chunk_size"),
    ],
)
def test_bad_settings_raise(kwargs, match) -> None:
    h, w, _, ids = _inputs(4, 6, 3)
    with pytest.raises(ValueError, match=match):
        linear_entropy_stats(h, w, ids, **kwargs)


def test_bad_inputs_raise() -> None:
    h, w, b, ids = _inputs(4, 6, 3, bias=True)
    with pytest.raises(ValueError, match="weight must be"):
        linear_entropy_stats(h, w[:, :2], ids)
    with pytest.raises(ValueError, match="weight.dtype"):
        linear_entropy_stats(h, w.float(), ids)
    with pytest.raises(ValueError, match="bias must be"):
        linear_entropy_stats(h, w, ids, bias=b[:3])
    with pytest.raises(ValueError, match=r"token_ids must lie in \[0, 6\)"):
        linear_entropy_stats(h, w, ids + 6)
    with pytest.raises(ValueError, match="token_ids shape"):
        linear_entropy_stats(h, w, ids[:2])

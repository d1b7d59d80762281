"""Tests of lit_entropy.functional.entropy.linear_loss (blockwise LM head + per-token loss, gradient in the forward).

Reference: the full-logits float64 computation (full logits, ``log_softmax``) with the same loss differentiated by
torch.autograd, and central finite differences (``gradcheck``).
"""

from __future__ import annotations

import pytest
import torch
from test_linear_entropy import _AllocationRecorder, _inputs, reference

from lit_entropy.functional import linear_entropy_loss


def _token_loss(shape, seed=5):
    """A nonlinear per-token loss (so the per-token derivatives differ between tokens and depend on the values)."""
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(shape, generator=gen, dtype=torch.float64)
    v = torch.randn(shape, generator=gen, dtype=torch.float64)

    def loss_fn(logp, entropy):
        return (u.to(logp.dtype) * torch.exp(logp.clamp(max=0.0)) + v.to(logp.dtype) * entropy.square()).sum()

    return loss_fn


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("use_bias", [False, True])
@pytest.mark.parametrize(("rows", "cols"), [(5, 7), (1, 64), (37, 53), (64, 4)])
def test_loss_values_and_gradients_match_full_logits_float64(temperature, use_bias, rows, cols) -> None:
    h, w, b, ids = _inputs(37, 53, 6, bias=use_bias, scale=2.0)
    loss_fn = _token_loss(37)
    loss, stats = linear_entropy_loss(
        h, w, ids, loss_fn, bias=b, temperature=temperature, policy_average=True, chunk_size=rows,
        vocab_chunk_size=cols,
    )  # fmt: skip
    ref = reference(h, w, ids, b, temperature)
    ref_loss = loss_fn(ref[0], ref[1])
    torch.testing.assert_close(loss, ref_loss.detach(), rtol=1e-12, atol=1e-12)
    for got, want in zip(stats, ref, strict=True):
        assert not got.requires_grad
        torch.testing.assert_close(got, want.detach(), rtol=1e-10, atol=1e-12)
    tensors = [t for t in (h, w, b) if t is not None]
    for g, r in zip(torch.autograd.grad(loss, tensors), torch.autograd.grad(ref_loss, tensors), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_leading_dims_incoming_gradient_and_partial_losses() -> None:
    h, w, _, ids = _inputs(12, 30, 5, seed=2)
    h3, ids3 = h.detach().view(3, 4, 5).requires_grad_(True), ids.view(3, 4)
    weights = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64).view(3, 4)
    # Only log-probs in the loss, and an incoming gradient of 2.5.
    loss, stats = linear_entropy_loss(h3, w, ids3, lambda lp, ent: (weights * lp).sum(), chunk_size=5)
    assert stats.logprobs.shape == (3, 4) and stats.policy_average is None
    ref = reference(h3.reshape(12, 5), w, ids)
    got = torch.autograd.grad(2.5 * loss, (h3, w))
    want = torch.autograd.grad(2.5 * (weights.reshape(-1) * ref[0]).sum(), (h3, w), retain_graph=True)
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)
    # Only entropy.
    loss, _ = linear_entropy_loss(h3, w, ids3, lambda lp, ent: ent.sum(), chunk_size=5)
    torch.testing.assert_close(
        torch.autograd.grad(loss, w)[0], torch.autograd.grad(ref[1].sum(), w)[0], rtol=1e-10, atol=1e-12
    )
    # A loss that ignores both: a constant, no gradient to the head.
    loss, _ = linear_entropy_loss(h3, w, ids3, lambda lp, ent: torch.tensor(3.0, dtype=torch.float64))
    assert float(loss.detach()) == 3.0
    assert torch.all(torch.autograd.grad(loss, w, materialize_grads=True)[0] == 0)


def test_tied_embedding_gradients_accumulate() -> None:
    h, w, _, ids = _inputs(9, 20, 4, seed=4)
    loss_fn = _token_loss(9, seed=8)
    emb_ids = torch.tensor([1, 5, 5, 19])

    def total(loss_of_head):
        return loss_of_head + w[emb_ids].square().sum()  # the same weight as an input embedding

    loss, _ = linear_entropy_loss(h, w, ids, loss_fn, chunk_size=4, vocab_chunk_size=6)
    ref = reference(h, w, ids)
    got = torch.autograd.grad(total(loss), (h, w))
    want = torch.autograd.grad(total(loss_fn(ref[0], ref[1])), (h, w))
    for g, r in zip(got, want, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-10, atol=1e-12)


def test_gradient_matches_central_finite_differences() -> None:
    h, w, b, ids = _inputs(6, 11, 3, bias=True, seed=6)
    loss_fn = _token_loss(6, seed=1)

    def fn(h, w, b):
        return linear_entropy_loss(h, w, ids, loss_fn, bias=b, temperature=0.8, chunk_size=4, vocab_chunk_size=5)[0]

    grads = torch.autograd.grad(fn(h, w, b), (h, w, b))
    gen = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for _ in range(4):  # directional derivatives along random directions of all three inputs
            d = [torch.randn(t.shape, generator=gen, dtype=torch.float64) for t in (h, w, b)]
            eps = 1e-6
            plus = fn(*(t + eps * v for t, v in zip((h, w, b), d, strict=True)))
            minus = fn(*(t - eps * v for t, v in zip((h, w, b), d, strict=True)))
            numeric = (plus - minus) / (2 * eps)
            analytic = sum((g * v).sum() for g, v in zip(grads, d, strict=True))
            assert float(numeric) == pytest.approx(float(analytic), rel=1e-6, abs=1e-8)


def test_second_backward_through_one_call_raises() -> None:
    h, w, _, ids = _inputs(5, 9, 3, seed=2)
    loss, _ = linear_entropy_loss(h, w, ids, lambda lp, ent: lp.sum())
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran a second time"):
        loss.backward()


def test_bf16_inputs_give_float32_stats_and_bf16_gradients() -> None:
    h, w, b, ids = _inputs(24, 80, 16, dtype=torch.bfloat16, bias=True, seed=9, scale=0.5)
    loss_fn = _token_loss(24, seed=3)
    loss, stats = linear_entropy_loss(h, w, ids, loss_fn, bias=b, temperature=0.9, chunk_size=7, vocab_chunk_size=16)
    h64, w64, b64 = (t.detach().double().requires_grad_(True) for t in (h, w, b))
    ref = reference(h64, w64, ids, b64, 0.9)
    assert stats.logprobs.dtype == torch.float32 and loss.dtype == torch.float32
    # bf16 logits carry a relative rounding error of 2^-9 (the matmul runs in bf16, like the model's head).
    torch.testing.assert_close(stats.logprobs.double(), ref[0].detach(), rtol=2e-2, atol=2e-2)
    got = torch.autograd.grad(loss, (h, w, b))
    want = torch.autograd.grad(loss_fn(ref[0], ref[1]), (h64, w64, b64))
    for g, r in zip(got, want, strict=True):
        assert g.dtype == torch.bfloat16
        scale = r.abs().max()
        torch.testing.assert_close(g.double() / scale, r / scale, rtol=0, atol=3e-2)


def test_no_grad_path_agrees_and_empty_input() -> None:
    h, w, _, ids = _inputs(10, 40, 4, dtype=torch.float32, seed=1, scale=60.0)  # logits over ~+-200
    loss_fn = _token_loss(10)
    loss, stats = linear_entropy_loss(h, w, ids, loss_fn, policy_average=True, chunk_size=3, vocab_chunk_size=7)
    with torch.no_grad():
        plain_loss, plain = linear_entropy_loss(
            h, w, ids, loss_fn, policy_average=True, chunk_size=3, vocab_chunk_size=7
        )
    assert float(plain_loss) == float(loss.detach())
    for a, g in zip(plain, stats, strict=True):
        torch.testing.assert_close(a, g, rtol=0, atol=0)
    assert torch.isfinite(torch.autograd.grad(loss, w)[0]).all()
    h0 = torch.zeros(0, 3, requires_grad=True)
    w0 = torch.randn(7, 3, requires_grad=True)
    loss, stats = linear_entropy_loss(h0, w0, torch.zeros(0, dtype=torch.long), lambda lp, ent: lp.sum() + ent.sum())
    assert float(loss.detach()) == 0.0 and stats.entropy.shape == (0,)
    assert torch.all(torch.autograd.grad(loss, w0)[0] == 0)


def test_memory_is_bounded_by_the_row_chunk_not_by_rows_times_vocab() -> None:
    # N x V = 120 x 960 logits; rows = 12 keep a [12, 960] buffer: every tensor created in the forward and the
    # backward is at most one of: that buffer, the weight gradient [V, H], per-row [N, H].
    n, vocab, hid, rows, cols = 120, 960, 4, 12, 240
    h, w, b, ids = _inputs(n, vocab, hid, dtype=torch.float32, bias=True, seed=3)
    bound = 4 * max(rows * vocab, vocab * hid, n * hid)
    rec = _AllocationRecorder()
    with rec:
        loss, _ = linear_entropy_loss(
            h, w, ids, lambda lp, ent: lp.sum() + ent.sum(), bias=b, chunk_size=rows, vocab_chunk_size=cols
        )
        loss.backward()
    assert 0 < rec.largest <= bound <= 4 * n * vocab / 10
    # One weight-gradient-sized tensor in all: autograd adopts it as w.grad instead of copying it.
    assert rec.sizes.count(4 * vocab * hid) == 1
    assert w.grad is not None and torch.isfinite(w.grad).all()
    # Nothing vocabulary-sized is saved by autograd (the gradients live on the function's context).
    saved: list[torch.Tensor] = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        linear_entropy_loss(h, w, ids, lambda lp, ent: lp.sum(), bias=b, chunk_size=rows, vocab_chunk_size=cols)
    assert not [t for t in saved if t.numel() >= vocab]


def test_bad_loss_fn_raises() -> None:
    h, w, _, ids = _inputs(4, 6, 3)
    with pytest.raises(ValueError, match="loss_fn must be callable"):
        linear_entropy_loss(h, w, ids, "sum")
    with pytest.raises(ValueError, match=r"loss_fn must return a scalar tensor, got \(4,\)"):
        linear_entropy_loss(h, w, ids, lambda lp, ent: lp)
    with pytest.raises(ValueError, match="chunk_size"):
        linear_entropy_loss(h, w, ids, lambda lp, ent: lp.sum(), chunk_size=0)

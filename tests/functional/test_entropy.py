"""Tests of lit_entropy.functional.entropy.logits against independent references.

References: plain-Python ``math`` loops over the vocabulary, a naive float64 ``log_softmax``
implementation differentiated by torch.autograd, and central finite differences.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_entropy.functional.entropy import (
    EntropyStats,
    default_chunk_rows,
    entropy_discriminator,
    entropy_from_logits,
    entropy_stats,
    predicted_entropy_change,
)

# ----------------------------------------------------------------------------------------------
# independent references
# ----------------------------------------------------------------------------------------------


def py_position(z: list[float], temperature: float = 1.0) -> tuple[list[float], list[float], float]:
    """Plain-Python softmax of one position: ``(p, log p, H)``."""
    scaled = [v / temperature for v in z]
    m = max(v for v in scaled if v != -math.inf)
    z_sum = sum(math.exp(v - m) for v in scaled)
    logp = [v - m - math.log(z_sum) for v in scaled]
    p = [math.exp(v) for v in logp]
    h = -sum(pi * li for pi, li in zip(p, logp, strict=True) if pi > 0.0)
    return p, logp, h


def py_discriminators(z: list[float], temperature: float = 1.0) -> list[float]:
    """``S_i = p_i (H + log p_i)`` for every vocabulary entry (0 where p_i = 0)."""
    p, logp, h = py_position(z, temperature)
    return [pi * (h + li) if pi > 0.0 else 0.0 for pi, li in zip(p, logp, strict=True)]


def naive_stats(logits: Tensor, token_ids: Tensor, temperature: float = 1.0):  # noqa: F821
    """Full-vocabulary float64 torch reference: ``(log p_k, H, S_k, E_p[S])``."""
    lp = torch.log_softmax(logits.double() / temperature, dim=-1)
    p = lp.exp()
    h = -(p * lp).sum(-1)
    lk = lp.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    s = lk.exp() * (h + lk)
    avg = h * (p * p).sum(-1) + (p * p * lp).sum(-1)
    return lk, h, s, avg


def _logits(*shape: int, scale: float = 2.0, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=gen, dtype=torch.float64) * scale).to(dtype)


def _tokens(shape: tuple[int, ...], vocab: int, seed: int = 1) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, shape, generator=gen)


# ----------------------------------------------------------------------------------------------
# gradients
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_entropy_gradient_is_minus_discriminator(temperature: float) -> None:
    z = _logits(9, seed=3)
    zl = z.tolist()
    s_ref = py_discriminators(zl, temperature)
    # Central finite differences of the plain-Python entropy, one logit at a time.
    eps = 1e-6
    fd = []
    for k in range(len(zl)):
        up, down = list(zl), list(zl)
        up[k] += eps
        down[k] -= eps
        fd.append((py_position(up, temperature)[2] - py_position(down, temperature)[2]) / (2 * eps))
    for k in range(len(zl)):
        assert fd[k] == pytest.approx(-s_ref[k] / temperature, abs=1e-8)
    assert sum(s_ref) == pytest.approx(0.0, abs=1e-14)

    leaf = z.clone().requires_grad_(True)
    entropy_from_logits(leaf, temperature=temperature).backward()
    torch.testing.assert_close(leaf.grad, torch.tensor(fd, dtype=torch.float64), rtol=0, atol=1e-8)

    # Finite differences of the library's own forward agree too (float64 path).
    fd_lib = []
    for k in range(len(zl)):
        step = torch.zeros_like(z)
        step[k] = eps
        fd_lib.append(
            float(
                entropy_from_logits(z + step, temperature=temperature)
                - entropy_from_logits(z - step, temperature=temperature)
            )
            / (2 * eps)
        )
    assert fd_lib == pytest.approx([-s / temperature for s in s_ref], abs=1e-8)


@pytest.mark.parametrize("temperature", [1.0, 0.8])
@pytest.mark.parametrize("chunk_size", [1, 2, 5])
def test_gradient_matches_naive_autograd(temperature: float, chunk_size: int) -> None:
    z = _logits(2, 3, 11, seed=5)
    ids = _tokens((2, 3), 11)
    gen = torch.Generator().manual_seed(9)
    w_lp, w_h = (
        torch.randn(2, 3, generator=gen, dtype=torch.float64),
        torch.randn(2, 3, generator=gen, dtype=torch.float64),
    )
    ours = z.clone().requires_grad_(True)
    out = entropy_stats(ours, ids, temperature=temperature, chunk_size=chunk_size, policy_average=True)
    (w_lp * out.logprobs + w_h * out.entropy).sum().backward()

    ref = z.clone().requires_grad_(True)
    lk, h, _, _ = naive_stats(ref, ids, temperature)
    (w_lp * lk + w_h * h).sum().backward()
    torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-10, atol=1e-12)

    # Only one of the two outputs used (the other gradient is None inside the backward).
    for pick in ("logprobs", "entropy"):
        a = z.clone().requires_grad_(True)
        b = z.clone().requires_grad_(True)
        getattr(entropy_stats(a, ids, temperature=temperature, chunk_size=chunk_size), pick).sum().backward()
        lk, h, _, _ = naive_stats(b, ids, temperature)
        (lk if pick == "logprobs" else h).sum().backward()
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_gradcheck_finite_differences(temperature: float) -> None:
    z = _logits(4, 6, seed=11).requires_grad_(True)
    ids = _tokens((4,), 6, seed=2)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = entropy_stats(x, ids, temperature=temperature, chunk_size=3)
        return out.logprobs, out.entropy

    assert torch.autograd.gradcheck(fn, (z,), eps=1e-6, atol=1e-7, rtol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_gradient_low_precision_logits(dtype: torch.dtype) -> None:
    z = _logits(3, 4, 40, seed=7, dtype=dtype)
    ids = _tokens((3, 4), 40)
    ours = z.clone().requires_grad_(True)
    out = entropy_stats(ours, ids, temperature=0.9, chunk_size=5)
    (out.logprobs.sum() + 0.5 * out.entropy.sum()).backward()
    assert ours.grad.dtype == dtype and ours.grad.shape == z.shape
    ref = z.double().requires_grad_(True)
    lk, h, _, _ = naive_stats(ref, ids, 0.9)
    (lk.sum() + 0.5 * h.sum()).backward()
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(ours.grad.double(), ref.grad, rtol=tol, atol=tol)


def test_backward_saves_no_vocabulary_sized_tensor_but_logits() -> None:
    z = _logits(6, 50, dtype=torch.float32).requires_grad_(True)
    ids = _tokens((6,), 50)
    saved: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = entropy_stats(z, ids, chunk_size=2, policy_average=True)
    vocab_sized = [t for t in saved if t.numel() >= 50]
    assert len(vocab_sized) == 1 and vocab_sized[0].data_ptr() == z.data_ptr()
    out.entropy.sum().backward()
    assert torch.isfinite(z.grad).all()


def test_non_viewable_logits_are_not_copied_and_match() -> None:
    # model_logits[:, :-1] cannot be viewed as [N, V]; results and gradients must still match.
    full = _logits(3, 6, 13, seed=4)
    ids = _tokens((3, 5), 13)
    leaf = full.clone().requires_grad_(True)
    out = entropy_stats(leaf[:, :-1], ids, chunk_size=4, policy_average=True)
    (out.logprobs.sum() + out.entropy.sum()).backward()
    ref_leaf = full.clone().requires_grad_(True)
    lk, h, s, avg = naive_stats(ref_leaf[:, :-1], ids)
    (lk.sum() + h.sum()).backward()
    for got, want in zip(out, (lk, h, s, avg), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(leaf.grad, ref_leaf.grad, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------
# first-order entropy change (THEORY section 2)
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("advantage", "ratio", "token"), [(1.3, None, 0), (-0.7, 1.25, 4), (2.0, 0.8, 7)])
def test_predicted_entropy_change_is_first_order(advantage: float, ratio: float | None, token: int) -> None:
    z = _logits(10, seed=21, scale=1.5)
    out = entropy_stats(z.unsqueeze(0), torch.tensor([token]), policy_average=True)
    p, _, h0 = py_position(z.tolist())
    r = 1.0 if ratio is None else ratio
    errors = {}
    for eta in (1e-2, 1e-3):
        alpha = eta * r * advantage
        # One softmax-gradient step on a single position: z <- z + alpha (e_k - p).
        moved = [
            zi + alpha * ((1.0 if i == token else 0.0) - pi)
            for i, (zi, pi) in enumerate(zip(z.tolist(), p, strict=True))
        ]
        measured = py_position(moved)[2] - h0
        predicted = predicted_entropy_change(
            out.discriminator,
            out.policy_average,
            torch.tensor([advantage], dtype=torch.float64),
            ratio=None if ratio is None else torch.tensor([ratio], dtype=torch.float64),
            lr=eta,
        )
        assert predicted.shape == (1,)
        errors[eta] = abs(measured - float(predicted[0]))
        assert errors[eta] / eta**2 < 10.0
        # The prediction is not trivially small: it has the measured sign and size at small steps.
        assert abs(float(predicted[0])) > 10 * errors[eta]
    ratio_of_errors = errors[1e-2] / errors[1e-3]
    assert 60.0 < ratio_of_errors < 160.0


def test_predicted_entropy_change_formula_and_broadcast() -> None:
    s = torch.tensor([[0.2, -0.1, 0.05], [0.0, 0.3, -0.2]])
    avg = torch.tensor([[0.1, 0.1, 0.1], [0.05, 0.05, 0.05]])
    adv = torch.tensor([[2.0], [-1.0]])
    ratio = torch.tensor([[1.0, 1.1, 0.9], [1.2, 1.0, 0.8]])
    got = predicted_entropy_change(s, avg, adv, ratio=ratio, lr=0.5)
    for i in range(2):
        for j in range(3):
            want = -0.5 * float(ratio[i, j]) * float(adv[i, 0]) * (float(s[i, j]) - float(avg[i, j]))
            assert float(got[i, j]) == pytest.approx(want, rel=1e-6)
    torch.testing.assert_close(
        predicted_entropy_change(s, avg, adv), predicted_entropy_change(s, avg, adv, ratio=torch.ones_like(s))
    )


# ----------------------------------------------------------------------------------------------
# policy average and discriminator
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_policy_average_is_expectation_of_discriminator(temperature: float) -> None:
    vocab = 12
    z = _logits(vocab, seed=8)
    # Every token of the vocabulary at the same position, as a batch of identical rows.
    out = entropy_stats(z.expand(vocab, vocab), torch.arange(vocab), temperature=temperature, policy_average=True)
    p, logp, h = py_position(z.tolist(), temperature)
    s_ref = py_discriminators(z.tolist(), temperature)
    torch.testing.assert_close(out.discriminator, torch.tensor(s_ref, dtype=torch.float64), rtol=1e-12, atol=1e-14)
    closed_form = h * sum(pi * pi for pi in p) + sum(pi * pi * li for pi, li in zip(p, logp, strict=True))
    expectation = sum(pi * si for pi, si in zip(p, s_ref, strict=True))
    assert closed_form == pytest.approx(expectation, abs=1e-14)
    assert out.policy_average.tolist() == pytest.approx([closed_form] * vocab, abs=1e-14)
    centred = out.discriminator - out.policy_average
    assert sum(pi * float(c) for pi, c in zip(p, centred, strict=True)) == pytest.approx(0.0, abs=1e-14)


def test_entropy_discriminator_formula() -> None:
    logp = torch.tensor([-0.1, -2.0, -7.5, -math.inf], dtype=torch.float64)
    h = torch.tensor([1.0, 1.0, 2.5, 0.4], dtype=torch.float64)
    got = entropy_discriminator(logp, h)
    want = [math.exp(-0.1) * 0.9, math.exp(-2.0) * (-1.0), math.exp(-7.5) * (-5.0), 0.0]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    # S > 0 exactly when p > exp(-H).
    assert (got[:3] > 0).tolist() == [math.exp(-0.1) > math.exp(-1.0), False, False]


# ----------------------------------------------------------------------------------------------
# forward values: chunking, shapes, dtypes, temperature
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_forward_matches_plain_python(temperature: float) -> None:
    z = _logits(4, 9, seed=12)
    ids = _tokens((4,), 9)
    out = entropy_stats(z, ids, temperature=temperature, chunk_size=3, policy_average=True)
    for row in range(4):
        p, logp, h = py_position(z[row].tolist(), temperature)
        k = int(ids[row])
        assert float(out.logprobs[row]) == pytest.approx(logp[k], abs=1e-12)
        assert float(out.entropy[row]) == pytest.approx(h, abs=1e-12)
        assert float(out.discriminator[row]) == pytest.approx(p[k] * (h + logp[k]), abs=1e-12)
        avg = sum(pi * pi * (h + li) for pi, li in zip(p, logp, strict=True))
        assert float(out.policy_average[row]) == pytest.approx(avg, abs=1e-12)
    torch.testing.assert_close(entropy_from_logits(z, temperature=temperature), out.entropy, rtol=0, atol=1e-15)


@pytest.mark.parametrize("chunk_size", [None, 1, 2, 4, 7, 15, 16, 1000])
def test_chunked_equals_reference_3d(chunk_size: int | None) -> None:
    z = _logits(3, 5, 50, dtype=torch.float32, seed=13)
    ids = _tokens((3, 5), 50)
    out = entropy_stats(z, ids, chunk_size=chunk_size, policy_average=True)
    ref = naive_stats(z, ids)
    assert isinstance(out, EntropyStats)
    for got, want in zip(out, ref, strict=True):
        assert got.shape == (3, 5) and got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6)
    whole = entropy_stats(z, ids, chunk_size=15, policy_average=True)
    for got, want in zip(out, whole, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs_give_float32(dtype: torch.dtype) -> None:
    z = _logits(6, 64, dtype=dtype, seed=14, scale=3.0)
    ids = _tokens((6,), 64)
    out = entropy_stats(z, ids, temperature=0.8, chunk_size=4, policy_average=True)
    ref = naive_stats(z.double(), ids, 0.8)  # reference of the *upcast* input
    for got, want in zip(out, ref, strict=True):
        assert got.dtype == torch.float32
        torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=2e-6)


def test_float64_stays_float64_and_policy_average_none() -> None:
    z = _logits(2, 3, 8, seed=15)
    ids = _tokens((2, 3), 8)
    out = entropy_stats(z, ids)
    assert out.policy_average is None
    assert all(t.dtype == torch.float64 for t in out[:3])
    ref = naive_stats(z, ids)
    for got, want in zip(out[:3], ref[:3], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    assert entropy_from_logits(z).dtype == torch.float64
    assert entropy_from_logits(z.float()).dtype == torch.float32


def test_one_dimensional_and_empty_inputs() -> None:
    z = _logits(7, seed=16)
    out = entropy_stats(z, torch.tensor(3), policy_average=True)
    assert out.entropy.shape == () and out.logprobs.shape == ()
    assert float(out.entropy) == pytest.approx(py_position(z.tolist())[2], abs=1e-12)
    empty = entropy_stats(torch.zeros(0, 4, 7), torch.zeros(0, 4, dtype=torch.long), policy_average=True)
    assert empty.entropy.shape == (0, 4) and empty.policy_average.shape == (0, 4)


def test_masked_vocabulary_entries() -> None:
    z = _logits(3, 8, seed=17)
    z[0, 2] = -math.inf
    z[1, :5] = -math.inf
    ids = torch.tensor([2, 6, 1])
    leaf = z.clone().requires_grad_(True)
    out = entropy_stats(leaf, ids, policy_average=True)
    (out.logprobs.clamp(min=-50).sum() + out.entropy.sum()).backward()
    assert float(out.logprobs[0].detach()) == -math.inf and float(out.discriminator[0]) == 0.0
    for row in range(3):
        p, logp, h = py_position(z[row].tolist())
        assert float(out.entropy[row].detach()) == pytest.approx(h, abs=1e-12)
        avg = sum(pi * pi * (h + li) for pi, li in zip(p, logp, strict=True) if pi > 0)
        assert float(out.policy_average[row]) == pytest.approx(avg, abs=1e-12)
    assert torch.isfinite(leaf.grad).all()
    # Masked entries have p = 0; the backward floors log p (float64: at -300), leaving them a negligible
    # gradient of order exp(-300) that cannot move a -inf logit.
    assert leaf.grad[z == -math.inf].abs().max() < 1e-100
    # Row 1: only entries 5..7 are live; compare with the gradient on the sub-vocabulary.
    sub = z[1, 5:].clone().requires_grad_(True)
    lk, h, _, _ = naive_stats(sub, torch.tensor(1))
    (lk + h).backward()
    torch.testing.assert_close(leaf.grad[1, 5:], sub.grad, rtol=1e-10, atol=1e-12)


def test_wide_logit_range_float32_accuracy() -> None:
    # Shifted logits down to -300: float32 exp() would produce denormals; the floor must not hurt accuracy.
    z = torch.linspace(-250.0, 50.0, 4000).reshape(2, 2000)
    z[1] = z[1].flip(0) * 0.2
    ids = torch.tensor([1999, 10])
    out = entropy_stats(z, ids, policy_average=True)
    ref = naive_stats(z, ids)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    rows=st.integers(1, 6),
    vocab=st.integers(1, 20),
    chunk=st.integers(1, 7),
    temperature=st.floats(0.2, 3.0),
    scale=st.floats(0.0, 30.0),
    seed=st.integers(0, 10_000),
)
def test_property_bounds_and_chunk_invariance(rows, vocab, chunk, temperature, scale, seed) -> None:
    z = _logits(rows, vocab, scale=scale, seed=seed)
    ids = _tokens((rows,), vocab, seed=seed + 1)
    out = entropy_stats(z, ids, temperature=temperature, chunk_size=chunk, policy_average=True)
    assert (out.entropy >= -1e-12).all() and (out.entropy <= math.log(vocab) + 1e-12).all()
    assert (out.logprobs <= 1e-12).all()
    ref = naive_stats(z, ids, temperature)
    for got, want in zip(out, ref, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


# ----------------------------------------------------------------------------------------------
# validation
# ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [0.0, -1.0, math.nan, math.inf])
def test_invalid_temperature(temperature: float) -> None:
    with pytest.raises(ValueError, match="temperature"):
        entropy_stats(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), temperature=temperature)
    with pytest.raises(ValueError, match="temperature"):
        entropy_from_logits(torch.zeros(2, 3), temperature=temperature)


@pytest.mark.parametrize("chunk_size", [0, -2, 1.5, True])
def test_invalid_chunk_size(chunk_size) -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_stats(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long), chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size"):
        entropy_from_logits(torch.zeros(2, 3), chunk_size=chunk_size)


@pytest.mark.parametrize(
    "token_ids",
    [
        torch.zeros(3, dtype=torch.long),
        torch.zeros(2, 1, dtype=torch.long),
        torch.zeros(2),
        torch.tensor([0, 3]),
        torch.tensor([-1, 0]),
    ],
)
def test_invalid_token_ids(token_ids: torch.Tensor) -> None:
    with pytest.raises(ValueError, match="token_ids"):
        entropy_stats(torch.zeros(2, 3), token_ids)


def test_invalid_logits_and_other_arguments() -> None:
    with pytest.raises(ValueError, match="logits"):
        entropy_stats(torch.zeros(2, 3, dtype=torch.long), torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="logits"):
        entropy_from_logits(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="lr"):
        predicted_entropy_change(torch.zeros(2), torch.zeros(2), torch.zeros(2), lr=-1.0)
    with pytest.raises(ValueError, match="advantages"):
        predicted_entropy_change(torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(4))
    with pytest.raises(ValueError, match="vocab_size"):
        default_chunk_rows(0)


def test_default_chunk_rows_budget() -> None:
    assert default_chunk_rows(151936, chunk_bytes=32 << 20) == (32 << 20) // (4 * 151936)
    assert default_chunk_rows(10**9, chunk_bytes=1) == 1
    assert default_chunk_rows(1000, device="cpu") * 4 * 1000 <= 1 << 20

"""scripts/bench/entropy.py head mode: the variants compute the same statistics and a tiny run prints its table."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def bench():
    from scripts.bench import entropy  # the repository root is on pytest's pythonpath (and spawned workers')

    return entropy


def test_head_variants_agree_on_values_and_gradients(bench) -> None:
    # Every variant times the same computation: log p_k and H from h @ W.T, gradients to h and W.
    gen = torch.Generator().manual_seed(0)
    hidden0, weight0 = torch.randn(6, 4, generator=gen), torch.randn(30, 4, generator=gen)
    ids = torch.randint(0, 30, (6,), generator=gen)
    results = {}
    for variant in ("naive", "chunked", "blockwise", "blockwise_loss"):
        hidden, weight = hidden0.clone().requires_grad_(True), weight0.clone().requires_grad_(True)
        out = bench._head_variant(variant, hidden, weight, ids, True, 4, 7)()
        results[variant] = (out[0].detach(), out[1].detach(), hidden.grad, weight.grad)
    for variant in ("chunked", "blockwise", "blockwise_loss"):
        for got, want in zip(results[variant], results["naive"], strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # The matmul floor does the head's three products: logits, then logits-shaped @ W and its transpose @ h.
    grad_h, grad_w = bench._head_variant("matmuls", hidden0, weight0, ids, True, 4, 7)()
    z = hidden0.double() @ weight0.double().T
    torch.testing.assert_close(grad_h.double(), z @ weight0.double(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad_w.double(), z.T @ hidden0.double(), rtol=1e-5, atol=1e-5)


def test_tiny_head_run_prints_the_table(bench, capsys) -> None:
    bench.main(
        ["--head", "--rows", "8", "--vocab", "50", "--hidden", "4", "--repeats", "1", "--backward"]
        + ["--variants", "chunked", "blockwise", "blockwise_loss", "matmuls"]
    )
    out = capsys.readouterr().out
    assert "matmul floor (cpu s): " in out and "x chunked)" in out
    assert "rows=8: one float32 logits tensor" in out
    assert "   blockwise " in out and " chunked " in out
    assert "targets (blockwise:" in out and "targets (blockwise_loss:" in out

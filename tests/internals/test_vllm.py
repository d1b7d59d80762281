"""Pins lit_entropy.internals.vllm against an installed vLLM (skipped without it; ``.ci/run`` runs it)."""

from __future__ import annotations

import inspect
import weakref

import pytest

from lit_entropy.internals.vllm import detach_client_finalizer


def test_detach_client_finalizer_detaches_a_finalizer() -> None:
    class Client:
        pass

    client, calls = Client(), []
    client._finalizer = weakref.finalize(client, calls.append, "shut down")
    assert detach_client_finalizer(client) and not client._finalizer.alive
    del client
    assert calls == [], "a detached finaliser must not run"
    assert not detach_client_finalizer(object())


@pytest.mark.vllm
def test_vllm_engine_clients_keep_a_finalizer() -> None:
    vllm = pytest.importorskip("vllm")
    from vllm.v1.engine import core_client

    assert "self._finalizer = weakref.finalize" in inspect.getsource(core_client), (
        f"(vllm {vllm.__version__}) engine-core clients no longer keep _finalizer: update lit_entropy/internals/vllm.py"
    )

"""vLLM private engine-client state lit_entropy changes. Pinned by ``tests/internals/test_vllm.py`` (skipped
where vLLM is not installed; ``.ci/run`` runs it in its vLLM environment)."""

from __future__ import annotations

from typing import Any

__all__ = ["detach_client_finalizer"]


def detach_client_finalizer(client: Any) -> bool:
    """Detach the ``weakref.finalize`` an engine-core client runs at garbage collection; True when there was one.

    vLLM's finaliser shuts the engine down, which ends by destroying the default process group; under an
    external launcher that group is the trainer's.
    """
    finalizer = getattr(client, "_finalizer", None)
    if finalizer is None:
        return False
    finalizer.detach()
    return True

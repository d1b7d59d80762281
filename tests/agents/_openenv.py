"""openenv-core for the adapter tests: imported from the main environment, or from ``$LIT_ENTROPY_OPENENV_DIR``
(``pip install --target DIR openenv-core==0.3.0``; appended to ``sys.path`` after site-packages, so torch,
transformers and pydantic stay the main environment's). :func:`load_openenv` skips the calling test module, with
the reason, where it cannot be had; :func:`guessing_environment_classes` builds an OpenEnv environment (its
``Environment`` base, pydantic ``Action`` / ``Observation``) that the tests wrap."""

from __future__ import annotations

import importlib
import os
import sys
from types import SimpleNamespace

import pytest

OPENENV_DIR_ENV = "LIT_ENTROPY_OPENENV_DIR"


def load_openenv() -> SimpleNamespace:
    """``Environment``, ``Action``, ``Observation``, ``State`` and ``StepResult`` of openenv-core; skips the calling
    test module where it does not import."""
    where = os.environ.get(OPENENV_DIR_ENV)
    if where and where not in sys.path:
        sys.path.append(where)
    how = f"pip install openenv-core==0.3.0 (the openenv extra), or into --target DIR with {OPENENV_DIR_ENV}=DIR"
    try:
        interfaces = importlib.import_module("openenv.core.env_server.interfaces")
        types = importlib.import_module("openenv.core.env_server.types")
        client_types = importlib.import_module("openenv.core.client_types")
    except ImportError as err:
        pytest.skip(f"openenv-core is not installed here ({how}): {err!r}", allow_module_level=True)
    return SimpleNamespace(
        Environment=interfaces.Environment, Action=types.Action, Observation=types.Observation, State=types.State,
        StepResult=client_types.StepResult,
    )  # fmt: skip

"""verl's published algorithm code as a test oracle: ``verl.trainer.ppo.core_algos`` and ``rollout_corr_helper``.

verl's package requires ray, hydra, wandb, vLLM-era pins of transformers...; the oracle tests need two of its
modules. ``.ci/run`` installs verl and the small packages those modules import (``.ci/verl-oracle.txt``, pinned)
with ``pip install --no-deps --target DIR`` and sets ``LIT_ENTROPY_VERL_DIR=DIR``. :func:`load_verl` appends DIR
to ``sys.path`` (after site-packages: torch, numpy, transformers stay the main environment's) and imports the two
modules as they are, with no placeholder module; a test module that calls it is skipped, with the reason, when
DIR is not set, holds no verl, or does not import.

By hand: ``pip install --no-deps --target /tmp/verl -r .ci/verl-oracle.txt`` then
``LIT_ENTROPY_VERL_DIR=/tmp/verl python -m pytest -m verl tests/oracles``.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

VERL_DIR_ENV = "LIT_ENTROPY_VERL_DIR"
REQUIREMENTS = Path(__file__).resolve().parents[1] / ".ci" / "verl-oracle.txt"


def pinned_verl_version() -> str:
    """The verl version ``.ci/verl-oracle.txt`` pins (the one the documented differences were checked against)."""
    for line in REQUIREMENTS.read_text().splitlines():
        if line.startswith("verl=="):
            return line.split("==", 1)[1].strip()
    raise AssertionError(f"{REQUIREMENTS} pins no verl version")


def load_verl() -> SimpleNamespace:
    """``core_algos``, ``rollout_corr`` (the helper module), ``ActorConfig``, ``AlgoConfig`` and ``version`` of the
    verl in ``$LIT_ENTROPY_VERL_DIR``; skips the calling test module when it cannot be had."""
    where = os.environ.get(VERL_DIR_ENV)
    how = f"pip install --no-deps --target DIR -r .ci/verl-oracle.txt, then {VERL_DIR_ENV}=DIR (.ci/run does both)"
    if not where:
        pytest.skip(f"verl oracle: {VERL_DIR_ENV} is not set ({how})", allow_module_level=True)
    if not (Path(where) / "verl" / "trainer" / "ppo" / "core_algos.py").is_file():
        pytest.skip(f"verl oracle: {VERL_DIR_ENV}={where} holds no verl package ({how})", allow_module_level=True)
    if where not in sys.path:
        sys.path.append(where)
    # verl/__init__.py loads every installed "verl.plugins" entry point unless told not to.
    os.environ.setdefault("VERL_USE_EXTERNAL_PLUGINS", "none")
    try:
        verl = importlib.import_module("verl")
        core_algos = importlib.import_module("verl.trainer.ppo.core_algos")
        rollout_corr = importlib.import_module("verl.trainer.ppo.rollout_corr_helper")
        actor_config = importlib.import_module("verl.workers.config").ActorConfig
        algo_config = importlib.import_module("verl.trainer.config").AlgoConfig
    except ImportError as err:
        pytest.skip(f"verl oracle: verl from {where} does not import: {err!r}", allow_module_level=True)
    return SimpleNamespace(
        core_algos=core_algos,
        rollout_corr=rollout_corr,
        ActorConfig=actor_config,
        AlgoConfig=algo_config,
        version=verl.__version__,
    )

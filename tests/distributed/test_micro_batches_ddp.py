"""Token-budget micro-batches on 2 gloo ranks (FSDP2): ranks whose own groupings differ in size still run matching
collectives, and the sharded gradient equals one process's single micro-batch over all rows (float64)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_entropy.step import global_loss_normalizer, rows_update_loss

HELPER = Path(__file__).with_name("_micro_batch_run.py")


def _helper():
    spec = importlib.util.spec_from_file_location("_micro_batch_run", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ranks_with_different_micro_batch_counts_equal_one_big_micro_batch(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(HELPER.parents[2])}
    result = subprocess.run(
        [sys.executable, str(HELPER), "--out", str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    got = torch.load(tmp_path / "grads.pt", weights_only=True)
    helper = _helper()
    own = got["own_groups"]
    assert own[0] > own[1]  # the ranks' own groupings differ ...
    assert own[0] > len(helper.RANK_ROWS[1])  # ... and rank 1 has fewer rows than micro-batches
    model = helper.build_model()
    experience = helper.batch(model)
    for mode in helper.MODES:
        assert got[f"{mode}/plans"] == [[own[0], 0], [own[0], own[0] - len(helper.RANK_ROWS[1])]]
        model.zero_grad(set_to_none=True)
        settings = helper.settings_for(mode)
        normalizer = global_loss_normalizer(experience.loss_mask, mode)
        rows_update_loss(model, experience, settings, normalizer=normalizer).loss.backward()
        for name, p in model.named_parameters():
            assert p.grad.abs().max() > 0, name
            torch.testing.assert_close(got[mode][name], p.grad, rtol=1e-9, atol=1e-12, msg=f"{mode} {name}")

"""``model.async_rollout`` on 2 gloo CPU ranks (DDP): the ranks agree on every batch's policy version, train
their own shards' prompts, end with the same weights, and the checkpoint holds each rank's prompts in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("_ddp_run.py")


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ddp_ranks_agree_on_versions_and_checkpoint_their_prompts_in_flight(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parents[2]), str(HELPER.parents[1])])}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a clean launch: Lightning starts rank 1 itself
    cmd = [sys.executable, str(HELPER), "--model", tiny_model_dir, "--out", str(tmp_path)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # Batch 1 fills the queue; batches 1-4 train at versions 0, 0, 1, 2 (one step late) on both ranks.
    assert ranks[0]["versions"] == ranks[1]["versions"] == [0.0, 0.0, 1.0, 2.0]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 4
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept the replicas equal through the pushes
    assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"])  # each rank its own shard
    saved = json.loads((tmp_path / "checkpoint.json").read_text())
    assert saved["versions"] == [4, 4] and [len(p) for p in saved["in_flight"]] == [2, 2]
    assert not set(saved["in_flight"][0]) & set(ranks[0]["prompts"])  # in flight = not trained yet

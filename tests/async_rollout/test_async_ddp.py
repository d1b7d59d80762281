"""``model.sampling.async_rollout`` on 2 gloo CPU ranks (DDP and FSDP2): the ranks agree on every batch's policy
version, train their own shards' prompts, end with the same weights, and the checkpoint holds each rank's prompts in
flight; under FSDP2 the worker samples from a plain copy holding the full weights."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HELPER = Path(__file__).with_name("_ddp_run.py")


def _launch(model_dir: str, out: Path, strategy: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPER.parents[2]), str(HELPER.parents[1])])}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a clean launch: Lightning starts rank 1 itself
    cmd = [sys.executable, str(HELPER), "--model", model_dir, "--out", str(out), "--strategy", strategy]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _check_versions_shards_and_checkpoint(ranks: list[dict], out: Path) -> None:
    # Batch 1 fills the queue; batches 1-4 train at versions 0, 0, 1, 2 (one step late) on both ranks.
    assert ranks[0]["versions"] == ranks[1]["versions"] == [0.0, 0.0, 1.0, 2.0]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] == 4
    assert not set(ranks[0]["prompts"]) & set(ranks[1]["prompts"])  # each rank its own shard
    saved = json.loads((out / "checkpoint.json").read_text())
    assert saved["versions"] == [4, 4] and [len(p) for p in saved["in_flight"]] == [2, 2]
    assert not set(saved["in_flight"][0]) & set(ranks[0]["prompts"])  # in flight = not trained yet


@pytest.mark.ddp
@pytest.mark.slow
def test_two_ddp_ranks_agree_on_versions_and_checkpoint_their_prompts_in_flight(tiny_model_dir, tmp_path):
    ranks = _launch(tiny_model_dir, tmp_path, "ddp")
    _check_versions_shards_and_checkpoint(ranks, tmp_path)
    assert ranks[0]["weights"] == ranks[1]["weights"]  # DDP kept the replicas equal through the pushes


@pytest.mark.ddp
@pytest.mark.slow
def test_two_fsdp2_ranks_agree_on_versions_and_sample_from_the_full_weights(tiny_model_dir, tmp_path):
    ranks = _launch(tiny_model_dir, tmp_path / "fsdp2", "fsdp2")
    _check_versions_shards_and_checkpoint(ranks, tmp_path / "fsdp2")
    # The first update trains a batch sampled with the weights it updates (version 0 at version 0): the worker's
    # plain copy holds exactly the sharded policy's weights, so engine and trainer log-probs agree; the next ones
    # were sampled one version earlier, and the gap shows it.
    for rank in ranks:
        assert abs(rank["gaps"][0]) < 1e-5 and all(abs(gap) > 1e-5 for gap in rank["gaps"][1:]), rank["gaps"]
    # The same run under DDP ends at the same weights (sharding changes no sample; float sums in another order).
    ddp = _launch(tiny_model_dir, tmp_path / "ddp", "ddp")
    assert ranks[0]["weights"] == pytest.approx(ddp[0]["weights"], rel=1e-5)

"""Multi-turn trajectories on 2 gloo CPU ranks (DDP and FSDP2) train as one process on the same global batch."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_entropy.models.tiny import save_tiny_model
from tests.agents._agents import chat_tokenizer

HELPER = Path(__file__).with_name("_distributed_run.py")


def _two_ranks(model_dir: str, out: Path, strategy: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(HELPER.parents[2])}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a clean launch: Lightning starts rank 1 itself
    cmd = [sys.executable, str(HELPER), "--model", model_dir, "--out", str(out), "--strategy", strategy]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("chat2"), chat_tokenizer(), num_layers=2))


@pytest.fixture(scope="module")
def single(model_dir, tmp_path_factory):
    spec = importlib.util.spec_from_file_location("_distributed_run", HELPER)
    helper = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(helper)
    out = tmp_path_factory.mktemp("single")
    threads = torch.get_num_threads()
    try:
        helper.run(model_dir, str(out), 1, "single")
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "rank0.json").read_text()), torch.load(out / "weights.pt", weights_only=True)


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp2"])
def test_two_ranks_train_multi_turn_trajectories_as_one_process(model_dir, single, tmp_path, strategy):
    """The ranks' trajectories together are the single process's (so the ranks ran different numbers of turns and,
    under FSDP2, stayed in lockstep), the logged global metrics and the final weights are the single process's."""
    reference, ref_weights = single
    ranks = _two_ranks(model_dir, tmp_path, strategy)

    # the run is multi-turn and not trivial: trajectories of several lengths, rewards that vary
    rows = [tuple(t) for batch in reference["trajectories"] for t in batch]
    assert len({turns for _, turns, _ in rows}) > 1
    assert all(row["train/reward/std"] > 0 for row in reference["rows"])
    assert all(row["train/multi_turn/environment_token_frac"] > 0 for row in reference["rows"])

    # each rank trains half the prompts of a global batch: together they are the one process's trajectories
    for b, batch in enumerate(reference["trajectories"]):
        both = ranks[0]["trajectories"][b] + ranks[1]["trajectories"][b]
        assert sorted(map(tuple, both)) == sorted(map(tuple, batch))
    # and in some batch one rank's trajectories ended rounds before the other's (the FSDP2 lockstep was needed)
    rounds = [[max(t[1] for t in batch) for batch in info["trajectories"]] for info in ranks]
    assert rounds[0] != rounds[1], rounds
    for info in ranks:
        assert info["global_step"] == reference["global_step"] == 2
        assert len(info["rows"]) == len(reference["rows"]) == 2
        for got, want in zip(info["rows"], reference["rows"], strict=True):
            assert got.keys() == want.keys()
            for key, value in want.items():
                assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key

    weights = torch.load(tmp_path / "weights.pt", weights_only=True)
    assert weights.keys() == ref_weights.keys()
    # Adam makes ~lr-sized steps even where g ~ 0, which amplifies float noise there
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-4)
    if strategy == "ddp":  # the replicas agree exactly
        replicas = [torch.load(tmp_path / f"replica{r}.pt", weights_only=True) for r in (0, 1)]
        torch.testing.assert_close(replicas[0], replicas[1], rtol=0, atol=0)

"""Issue 35 §10: a checkpoint write that runs out of room ends in one line and leaves the previous file intact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

#: The previous checkpoint, then one larger than the file size limit (``ulimit -f``: torch's zip writer turned
#: the EFBIG into "[enforce fail at inline_container.cc] unexpected pos").
SCRIPT = """
import resource, sys, torch
from lit_entropy.checkpointing import AtomicCheckpointIO, DiskFullError
path = sys.argv[1]
AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, path)
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, resource.RLIM_INFINITY))
try:
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(2), "w": torch.zeros(100_000)}, path)
except DiskFullError as err:
    print(err.strerror)
"""


def test_a_write_over_the_file_size_limit_says_no_space_and_keeps_the_previous_file(tmp_path):
    import torch

    path = tmp_path / "checkpoints" / "last.ckpt"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", SCRIPT, str(path)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip() == (
        f"no space left on device while writing {path} (File too large); the previous file, if any, is intact. "
        "Free space on that file system or point the output elsewhere"
    )
    assert torch.load(path, weights_only=True)["step"] == 1
    assert os.listdir(path.parent) == ["last.ckpt"]  # the temporary is gone


def test_fit_out_of_room_for_its_checkpoint_ends_in_one_line(tmp_path):
    command = (
        f"ulimit -f 1000; exec {sys.executable} -m lit_entropy fit --config {ROOT / 'configs' / 'grpo_tiny.yaml'} "
        "--trainer.max_steps=2 --trainer.val_check_interval=2 --data.num_train_examples=32 "
        "--data.num_val_examples=8 --data.val_batch_size=8 --val_before_train=false"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 1, result.stderr[-3000:]
    last = result.stderr.rstrip().splitlines()[-1]
    assert last.startswith("lit-entropy: error: no space left on device while writing runs/grpo_tiny/version_0/"), last
    assert "(File too large); the previous file, if any, is intact" in last
    assert "Traceback" not in result.stderr

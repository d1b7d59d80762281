"""Issue 11: a user's mistake ends in one clear message naming the setting or file and the value; no data is lost."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_entropy.rewards import check_rewards


# ----------------------------------------------------------------------------- reward outputs
def test_check_rewards_accepts_one_finite_number_per_completion():
    out = check_rewards("my_reward", [1, 0.5, np.float32(0.25), True], 4)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.5, 0.25, 1.0]
    assert check_rewards("t", torch.tensor([0.0, 2.0]), 2).tolist() == [0.0, 2.0]
    assert check_rewards("a", np.array([3.0]), 1).tolist() == [3.0]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, 0.0], r"reward function 'my_reward' returned 2 rewards for 3 completions"),
        ([1.0, "1", 0.0], r"'my_reward': item 1 is '1' \(str\), not a number"),
        ([1.0, 0.0, None], r"'my_reward': item 2 is None \(NoneType\)"),
        ([1.0, math.nan, math.inf], r"'my_reward': item 1 is nan; rewards must be finite"),
        ([1.0, 0.0, math.inf], r"'my_reward': item 2 is inf"),
        (torch.tensor([[1.0, 0.0, 1.0]]), r"'my_reward' must return one number per completion \(3\), got a tensor"),
        ("101", r"'my_reward' must return a list of 3 floats.*str"),
        (None, r"'my_reward' must return a list of 3 floats.*NoneType"),
    ],
)
def test_bad_reward_outputs_name_the_function_and_the_first_offending_item(values, message):
    with pytest.raises(ValueError, match=message):
        check_rewards("my_reward", values, 3)


# ----------------------------------------------------------------------------- checkpoints and exports on disk
def test_kill_9_during_a_checkpoint_write_leaves_no_file_a_later_run_trips_on(tmp_path):
    import os
    import signal
    import subprocess
    import sys

    from lit_entropy.checkpointing import AtomicCheckpointIO

    path = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, path)
    script = (
        "import sys, time, torch\n"
        "from lit_entropy.checkpointing import AtomicCheckpointIO\n"
        "def slow(obj, f, *a, **k):\n"
        "    f.write(b'partial'); f.flush(); print('writing', flush=True); time.sleep(120)\n"
        "torch.save = slow\n"
        "AtomicCheckpointIO().save_checkpoint({'step': 2}, sys.argv[1])\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(path)], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "writing"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    names = os.listdir(path.parent)
    stray = [n for n in names if n != "last.ckpt"]
    assert len(stray) == 1 and stray[0].startswith(".lit_entropy_tmp.")
    # Lightning finds "last" checkpoints by substring and HPC ones by "hpc_ckpt_": the stray matches neither
    assert "last" not in stray[0] and "hpc_ckpt" not in stray[0] and not stray[0].endswith(".ckpt")
    assert torch.load(path, weights_only=True)["step"] == 1  # the previous checkpoint is intact
    AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(3)}, path)  # the next write cleans up
    assert os.listdir(path.parent) == ["last.ckpt"]
    assert torch.load(path, weights_only=True)["step"] == 3


def test_checkpoint_files_get_normal_permissions_and_a_full_disk_is_named(tmp_path, monkeypatch):
    import errno
    import os

    from lit_entropy.checkpointing import AtomicCheckpointIO

    old = os.umask(0o022)
    try:
        path = tmp_path / "a.ckpt"
        AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(1)}, path)
        assert path.stat().st_mode & 0o777 == 0o644  # not mkstemp's 0600

        def full(obj, f, *args, **kwargs):
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(torch, "save", full)
        with pytest.raises(OSError, match=rf"no space left on device while writing {path}") as err:
            AtomicCheckpointIO().save_checkpoint({"step": torch.tensor(2)}, path)
        assert err.value.errno == errno.ENOSPC
        monkeypatch.undo()
        assert torch.load(path, weights_only=True)["step"] == 1
        assert os.listdir(tmp_path) == ["a.ckpt"]
    finally:
        os.umask(old)


@pytest.fixture
def tiny_policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def test_export_never_deletes_a_users_files_and_replaces_its_own_exports(tiny_policy, tmp_path):
    import os

    from transformers import AutoModelForCausalLM

    from lit_entropy.export import EXPORT_MARKER, export_hf_model

    policy, tokenizer = tiny_policy
    old = os.umask(0o022)
    try:
        out = export_hf_model(policy, tokenizer, tmp_path / "export")
    finally:
        os.umask(old)
    assert (out / EXPORT_MARKER).is_file()
    assert out.stat().st_mode & 0o777 == 0o755  # not mkdtemp's 0700
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in out.iterdir())
    loaded = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(loaded.state_dict(), policy.state_dict(), rtol=0, atol=0)
    export_hf_model(policy, tokenizer, out)  # a previous export of this library may be replaced

    user_dir = tmp_path / "my_project"
    user_dir.mkdir()
    (user_dir / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match=r"--out='.*my_project' is a non-empty directory .*notes\.txt.*--overwrite"):
        export_hf_model(policy, tokenizer, user_dir)
    assert os.listdir(user_dir) == ["notes.txt"] and (user_dir / "notes.txt").read_text() == "precious"
    a_file = tmp_path / "model.bin"
    a_file.write_text("data")
    with pytest.raises(FileExistsError, match=r"is an existing file"):
        export_hf_model(policy, tokenizer, a_file)
    assert a_file.read_text() == "data"
    export_hf_model(policy, tokenizer, user_dir, overwrite=True)  # on explicit request only
    assert not (user_dir / "notes.txt").exists() and (user_dir / EXPORT_MARKER).is_file()
    assert sorted(n for n in os.listdir(tmp_path) if n.startswith(".")) == []  # no temporaries left


def test_export_command_refuses_a_foreign_directory_in_one_line_before_loading(tmp_path, capsys):
    from lit_entropy.cli import main

    user_dir = tmp_path / "out"
    user_dir.mkdir()
    (user_dir / "keep.txt").write_text("x")
    with pytest.raises(SystemExit) as exit_info:  # the checkpoint does not even exist: refused first
        main(["export", "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(user_dir)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("lit-entropy: error: --out=") and "keep.txt" in err[0]
    assert (user_dir / "keep.txt").read_text() == "x"
    with pytest.raises(SystemExit):
        main(["export", "--ckpt_path", str(tmp_path / "none.ckpt"), "--out", str(tmp_path / "new")])
    assert "missing; expected a consolidated .ckpt file" in capsys.readouterr().err

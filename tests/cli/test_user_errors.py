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

    from lit_entropy.models.export import EXPORT_MARKER, export_hf_model

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
    message = r"--out='.*my_project' is a non-empty directory .*notes\.txt.*--overwrite"
    with pytest.raises(FileExistsError, match=message):
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


# ----------------------------------------------------------------------------- data files
def _jsonl(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_missing_and_empty_data_files_are_refused_at_construction(tmp_path):
    from lit_entropy.data.datamodule import PromptDataModule

    with pytest.raises(ValueError, match=r"train_dataset='data/train\.jsonl' does not exist \(resolved to /"):
        PromptDataModule(train_dataset="data/train.jsonl")
    empty = tmp_path / "val.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match=rf"val_dataset='{empty}' is an empty file \(0 bytes\)"):
        PromptDataModule(val_dataset=str(empty))


def test_unknown_characters_are_an_error_naming_them_and_the_line(tmp_model_dir_with_unk, tmp_path):
    from lit_entropy.data.datamodule import PromptDataModule

    path = tmp_path / "train.jsonl"
    # a blank line between the rows: row 1 is on line 3
    path.write_text('{"prompt": "1+2=", "answer": "3"}\n\n{"prompt": "10/2=", "answer": "5"}\n')
    dm = PromptDataModule(
        train_dataset=str(path), val_dataset=None, tokenizer_name_or_path=tmp_model_dir_with_unk, batch_size=1
    )
    message = rf"cannot encode the characters '/' \(1 of 2 prompts\); first at row 1 \(line 3 of {path}\): \['/'\]"
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


def test_unknown_characters_of_the_arithmetic_task_name_the_alphabet():
    from lit_entropy.data.datamodule import PromptDataModule

    dm = PromptDataModule(num_train_examples=16, prompt_template="Q:{prompt}", val_dataset=None)
    message = r"cannot encode the characters ':Q' \(some come from prompt_template\).*knows only '0123456789"
    with pytest.raises(ValueError, match=message):
        dm.setup("fit")


@pytest.fixture(scope="session")
def tmp_model_dir_with_unk(tiny_model_dir):
    return tiny_model_dir  # the char tokenizer of the tiny model has an <unk> token


def test_non_utf8_and_renamed_columns_name_the_file_line_and_column(tmp_path, tiny_model_dir):
    from lit_entropy.data.datamodule import PromptDataModule

    bad = tmp_path / "latin1.csv"
    bad.write_bytes("prompt,answer\n1+2=,3\ncaf\xe9=,4\n".encode("latin-1"))
    dm = PromptDataModule(train_dataset=str(bad), val_dataset=None, tokenizer_name_or_path=tiny_model_dir)
    with pytest.raises(ValueError, match=rf"train_dataset='{bad}' is not UTF-8 text: line 3, column 4 has the bytes"):
        dm.setup("fit")
    renamed = _jsonl(tmp_path / "r.jsonl", [{"question": "1+2=", "answer": "3"}])
    dm = PromptDataModule(train_dataset=renamed, val_dataset=None, tokenizer_name_or_path=tiny_model_dir)
    with pytest.raises(ValueError, match=r"prompt_key='prompt' is not a column .*\['question', 'answer'\]\)"):
        dm.setup("fit")
    dm = PromptDataModule(
        train_dataset=renamed, val_dataset=None, tokenizer_name_or_path=tiny_model_dir, prompt_key="questoin"
    )
    with pytest.raises(ValueError, match=r"did you mean 'question'\?"):
        dm.setup("fit")


def test_custom_data_with_the_embedded_model_names_a_setting_that_exists(tmp_path):
    from lit_entropy.data.datamodule import PromptDataModule
    from lit_entropy.models.paths import MODEL_PATH_SETTING

    data = _jsonl(tmp_path / "t.jsonl", [{"prompt": "1+2=", "answer": "3"}])
    with pytest.raises(ValueError, match=rf"With lit-entropy set {MODEL_PATH_SETTING} to your model"):
        PromptDataModule(train_dataset=data, val_dataset=None).setup("fit")


# ----------------------------------------------------------------------------- model paths
def test_model_path_mistakes_are_named_before_loading(tmp_path, tiny_model_dir):
    import shutil

    from lit_entropy.models.paths import check_model_dir

    setting = "model.policy.model_name_or_path"
    assert check_model_dir(tiny_model_dir) == tiny_model_dir
    assert check_model_dir("Qwen/Qwen2.5-7B-Instruct") == "Qwen/Qwen2.5-7B-Instruct"  # a hub id is left alone
    missing = str(tmp_path / "models" / "qwen")
    with pytest.raises(ValueError, match=rf"{setting}='{missing}' does not exist \(resolved to"):
        check_model_dir(missing)
    with pytest.raises(ValueError, match=r"'\./no/such/dir' does not exist"):
        check_model_dir("./no/such/dir")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=rf"{setting}='{empty}' is an empty directory"):
        check_model_dir(str(empty))
    ckpt = tmp_path / "last.ckpt"
    ckpt.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"is a Lightning checkpoint file, not a model directory.*lit-entropy export"):
        check_model_dir(str(ckpt))
    lfs = tmp_path / "lfs"
    shutil.copytree(tiny_model_dir, lfs)
    (lfs / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:abc\nsize 1234\n")
    with pytest.raises(ValueError, match=r"model\.safetensors is a Git LFS pointer.*git lfs pull"):
        check_model_dir(str(lfs))
    no_weights = tmp_path / "cfg_only"
    no_weights.mkdir()
    (no_weights / "config.json").write_text("{}")
    with pytest.raises(ValueError, match=r"has a config.json but no weights"):
        check_model_dir(str(no_weights))
    assert check_model_dir(str(no_weights), require_weights=False)  # a tokenizer directory needs no weights


def test_the_datamodule_checks_its_tokenizer_path(tmp_path):
    from lit_entropy.data.datamodule import PromptDataModule

    empty = tmp_path / "empty_model"
    empty.mkdir()
    dm = PromptDataModule(tokenizer_name_or_path=str(empty))
    with pytest.raises(ValueError, match=r"tokenizer_name_or_path \(lit-entropy: model.policy.model_name_or_path\)="):
        dm.setup("fit")


# ----------------------------------------------------------------------------- entropy clipping settings and NaN
def _poisoned_batch(seed: int):
    g = torch.Generator().manual_seed(seed)
    S = torch.randn(4, 6, generator=g, dtype=torch.float64)
    E = S + 0.3 * torch.randn(4, 6, generator=g, dtype=torch.float64)
    S[0, 1] = -50.0  # an outlier that Clip_B / Clip_V mask when the statistics are not poisoned
    E[0, 1] = 5.0
    A = torch.randn(4, 6, generator=g, dtype=torch.float64)
    A[0, 1] = -1.0
    mask = torch.ones(4, 6, dtype=torch.bool)
    mask[3, 4:] = False
    bad = torch.zeros(4, 6, dtype=torch.bool)
    bad[1, 2] = bad[2, 3] = True
    S[1, 2] = math.nan
    S[2, 3] = -math.inf
    return S, E, A, mask, bad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_non_finite_discriminator_tokens_are_excluded_and_kept_not_switching_clipping_off(seed):
    from _clipping_references import ref_clip_b, ref_clip_v

    from lit_entropy.functional.selection import clip_b_mask, clip_v_mask

    S, E, A, mask, bad = _poisoned_batch(seed)
    clean = mask & ~bad
    # reference: the batch without the non-finite tokens (plain Python statistics), those tokens kept
    S0 = torch.where(bad, torch.zeros_like(S), S)
    expected_b = torch.tensor(ref_clip_b(S0.tolist(), A.tolist(), clean.tolist(), 1.0)) | bad
    expected_v = torch.tensor(ref_clip_v(S0.tolist(), E.tolist(), A.tolist(), clean.tolist(), 1.0, 0.1)) | bad
    keep_b = clip_b_mask(S, A, mask, mu=1.0)
    keep_v = clip_v_mask(S, E, A, mask, mu=1.0, max_frac=0.1)
    assert torch.equal(keep_b, expected_b) and torch.equal(keep_v, expected_v)
    assert not keep_b[0, 1] and not keep_v[0, 1], "clipping is still on for the finite tokens"
    assert keep_b[bad].all() and keep_v[bad].all()


def test_the_callback_logs_the_share_of_non_finite_tokens():
    from lit_entropy.callbacks import EntropyDiscriminatorClipping
    from lit_entropy.protocol import TokenMaskContext

    S, E, A, mask, bad = _poisoned_batch(0)
    logged = {}

    class Module:
        trainer = object()

        def log(self, name, value, **kwargs):
            logged[name] = value

    context = TokenMaskContext(mask=mask, advantages=A, discriminator=S.float(), policy_average=E.float())
    keep = EntropyDiscriminatorClipping("clip_v", mu=1.0, max_frac=0.1).keep_mask(None, Module(), context)
    assert not keep[0, 1] and keep[bad].all()
    assert logged["train/entropy_clip/nonfinite_frac"] == pytest.approx(2 / int(mask.sum()))
    assert math.isfinite(logged["train/entropy_clip/s_mean"]) and logged["train/entropy_clip/frac"] > 0


def test_a_callback_setting_the_chosen_rule_ignores_is_warned_about():
    import warnings

    from lit_entropy.callbacks import EntropyDiscriminatorClipping

    with pytest.warns(UserWarning, match=r"method='clip_b', max_frac=0.01\): max_frac is ignored"):
        EntropyDiscriminatorClipping("clip_b", max_frac=0.01)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EntropyDiscriminatorClipping("clip_b")  # the default is not a user choice
        EntropyDiscriminatorClipping("clip_b", max_frac=None)
        EntropyDiscriminatorClipping("clip_v", max_frac=0.01)


def test_a_missing_math_verify_names_the_package_to_install(monkeypatch):
    import sys

    from lit_entropy.rewards import math_answers

    math_answers._math_verify_api.cache_clear()
    monkeypatch.setitem(sys.modules, "math_verify", None)  # as if not installed
    try:
        with pytest.raises(ImportError, match=r"reward_fn='math_verify' needs the math-verify package.*pip install"):
            math_answers.math_verify_reward([r"\boxed{1}"], ["1"])
    finally:
        math_answers._math_verify_api.cache_clear()

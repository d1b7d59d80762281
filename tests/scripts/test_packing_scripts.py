"""scripts/bench/default_exactness.py (the scalar comparison, the export) and scripts/bench/profile_packing.py (its
batch, a tiny run's arithmetic)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from _scripts import load_script


def test_compare_scalars_is_bit_for_bit_on_train_tags():
    exact = load_script("scripts.bench.default_exactness")
    value = float(np.float32(0.1))
    next_up = float(np.nextafter(np.float32(0.1), np.float32(1.0)))  # one float32 ulp above
    base = {
        "train/a": [(0, value), (1, 2.0)],
        "train/b": [(0, value)],
        "train/c": [(0, float("nan"))],
        "train/gone": [(0, 1.0)],
        "val/x": [(0, 1.0)],
    }
    head = {
        "train/a": [(0, value), (1, 2.0)],
        "train/b": [(0, next_up)],
        "train/c": [(0, float("nan"))],
        "train/new": [(0, 1.0)],
        "val/x": [(0, 5.0)],
    }
    result = exact.compare_scalars(base, head)
    assert result == {"equal": ["train/a"], "differ": ["train/b", "train/c"], "base_only": ["train/gone"],
                      "head_only": ["train/new"]}  # fmt: skip
    # A tag logged at other steps differs even with the same values.
    assert exact.compare_scalars({"train/a": [(0, 1.0)]}, {"train/a": [(1, 1.0)]})["differ"] == ["train/a"]


def test_export_revision_extracts_the_commit(tmp_path):
    exact = load_script("scripts.bench.default_exactness")
    repo = Path(exact.REPO)
    if subprocess.run(["git", "-C", str(repo), "rev-parse"], capture_output=True).returncode:
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    commit = exact.export_revision("HEAD", tmp_path / "tree")
    assert commit == head
    shown = subprocess.run(["git", "-C", str(repo), "show", "HEAD:pyproject.toml"], capture_output=True, text=True)
    assert (tmp_path / "tree" / "pyproject.toml").read_text() == shown.stdout


def test_profile_rollout_has_the_drawn_lengths():
    profile = load_script("scripts.bench.profile_packing")
    lengths = torch.tensor([3, 1, 5])
    rollout = profile.random_rollout(lengths, prompt_length=2, vocab_size=50, seed=0)
    assert rollout.sequences.shape == (3, 7) and rollout.prompt_length == 2
    assert rollout.response_mask.sum(-1).tolist() == [3, 1, 5]
    assert rollout.attention_mask.tolist() == [[1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 1]]
    assert int(rollout.sequences.min()) >= 3  # no special token (pad 0, EOS 1, BOS 2) inside a row


def test_profile_tiny_run_prints_the_split(capsys):
    profile = load_script("scripts.bench.profile_packing")
    out = profile.main(["--vocab-size", "256", "--hidden-size", "64", "--num-layers", "1", "--rows", "4",
                        "--max-new-tokens", "40", "--repeats", "1"])  # fmt: skip
    assert set(out) == {"padded", "packed", "vocabulary", "optimizer", "ratio"}
    assert all(value >= 0 for value in out.values())
    # one measured batch: the medians are that batch's values
    assert out["ratio"] == pytest.approx((out["packed"] + out["optimizer"]) / (out["padded"] + out["optimizer"]))
    printed = capsys.readouterr().out
    transformer = re.search(r"\| transformer forward \+ backward \| (-?[\d.]+) \| (-?[\d.]+) \|", printed)
    assert transformer is not None
    assert float(transformer.group(1)) == pytest.approx(out["padded"] - out["vocabulary"], abs=0.006)
    assert float(transformer.group(2)) == pytest.approx(out["packed"] - out["vocabulary"], abs=0.006)


def test_weights_hash_covers_names_dtypes_shapes_and_bytes(tmp_path):
    import hashlib

    from safetensors.torch import save_file

    exact = load_script("scripts.bench.default_exactness")
    b = torch.tensor([[1.0, -2.0]], dtype=torch.bfloat16)
    a = torch.arange(3, dtype=torch.float32)
    save_file({"b": b, "a": a}, str(tmp_path / "model.safetensors"))
    # Reference: the same recipe written out by hand, keys sorted (a before b whatever the file's order).
    expected = hashlib.sha256()
    expected.update(b"a|torch.float32|(3,)|" + np.arange(3, dtype=np.float32).tobytes())
    expected.update(b"b|torch.bfloat16|(1, 2)|" + bytes([0x80, 0x3F, 0x00, 0xC0]))  # bf16 1.0, -2.0 little-endian
    assert exact.weights_hash(tmp_path) == expected.hexdigest()
    # One changed value, or the same bytes under another shape, change the hash.
    a_next = torch.nextafter(a, torch.full_like(a, 10.0))  # one float32 ulp up
    save_file({"b": b, "a": a_next}, str(tmp_path / "model.safetensors"))
    assert exact.weights_hash(tmp_path) != expected.hexdigest()
    save_file({"b": b.reshape(2, 1), "a": a}, str(tmp_path / "model.safetensors"))
    assert exact.weights_hash(tmp_path) != expected.hexdigest()
    with pytest.raises(FileNotFoundError, match="safetensors"):
        exact.weights_hash(tmp_path / "missing")

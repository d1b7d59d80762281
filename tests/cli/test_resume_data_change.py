"""Issue 35 §10: a resume refuses training data that changed since the checkpoint, in one line."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from lit_entropy.cli import SettingsError, cli_main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"


def _rows(n: int) -> str:
    return "".join(json.dumps({"prompt": f"{i % 9}+{i % 7}=", "answer": str(i % 9 + i % 7)}) + "\n" for i in range(n))


def test_a_changed_training_file_is_refused_on_resume_naming_it_and_the_override(tmp_path, monkeypatch, tiny_model_dir):
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "own.jsonl"
    data.write_text(_rows(32))
    common = ["--trainer.enable_progress_bar=false", "--data.val_dataset=null", "--val_before_train=false"]
    common.append("--trainer.val_check_interval=1")
    first = ["fit", "--config", str(GRPO_TINY), *common, f"--data.train_dataset={data}", "--trainer.max_steps=1"]
    first.append(f"--model.policy.model_name_or_path={tiny_model_dir}")
    cli_main(first)
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    data.write_text(_rows(48))  # 32 -> 48 rows
    resume = ["fit", "--config", str(run / "config.yaml"), *common[:1], f"--ckpt_path={checkpoint}"]
    with pytest.raises(SettingsError) as refused:
        cli_main([*resume, "--trainer.max_steps=2"])
    message = str(refused.value)
    assert message.startswith(f"data.train_dataset: {data} changed since the checkpoint was written (sha256 ")
    assert "--resume_with_changes true" in message and "\n" not in message
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main([*resume, "--trainer.max_steps=2", "--resume_with_changes=true"])
    assert any(f"data.train_dataset: {data} changed" in str(w.message) for w in caught)

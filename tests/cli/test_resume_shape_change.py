"""Issue 35 §10: ``--resume_with_changes`` with LoRA on a full checkpoint is one line, and the run stays as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from lit_entropy.cli import SettingsError, cli_main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
SHORT = [
    "--trainer.enable_progress_bar=false",
    "--trainer.val_check_interval=1",
    "--data.num_train_examples=32",
    "--data.num_val_examples=8",
    "--data.val_batch_size=8",
    "--val_before_train=false",
]


def test_lora_settings_on_a_full_checkpoint_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli_main(["fit", "--config", str(GRPO_TINY), *SHORT, "--trainer.max_steps=1"])
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    before = sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs").rglob("*"))
    checkpoint = run / "checkpoints" / "last.ckpt"
    resume = ["fit", "--config", str(run / "config.yaml"), f"--ckpt_path={checkpoint}", "--trainer.max_steps=2"]
    with pytest.raises(SettingsError) as refused:
        cli_main([*resume, "--model.policy.lora.r=4", "--resume_with_changes=true"])
    message = str(refused.value)
    assert message.startswith(
        f"model.policy.lora: {checkpoint} holds full-model weights but these settings train LoRA adapters; "
    ), message
    assert "lit-entropy export --ckpt_path" in message and "\n" not in message
    assert sorted(p.relative_to(tmp_path) for p in (tmp_path / "runs").rglob("*")) == before

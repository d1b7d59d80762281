"""Every cheap command README shows runs as written (plus a few-step budget), in a fresh working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_entropy.cli import cli_main, export_main

CONFIGS = Path(__file__).parents[1] / "configs"
# Appended to README's commands: a few steps on a few problems.
FEW = [
    "--trainer.enable_progress_bar=false",
    "--data.num_train_examples=64",
    "--data.num_val_examples=16",
    "--data.val_batch_size=16",
]
FEW_FIT = [*FEW, "--trainer.max_steps=3", "--trainer.val_check_interval=2"]


@pytest.mark.slow
def test_readme_commands(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    grpo = str(CONFIGS / "grpo_tiny.yaml")

    # lit-entropy fit --config configs/grpo_tiny.yaml
    cli_main(["fit", "--config", grpo, *FEW_FIT])
    run = Path("runs/grpo_tiny/version_0")
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True, mmap=True)["global_step"] == 3  # the final step
    assert (run / "hf_model" / "config.json").is_file() and (run / "config.yaml").is_file()

    # lit-entropy validate --config configs/grpo_tiny.yaml --ckpt_path runs/grpo_tiny/version_0/checkpoints/last.ckpt
    cli = cli_main(["validate", "--config", grpo, "--ckpt_path", str(last), *FEW])
    assert "val/avg@8" in cli.trainer.callback_metrics
    # lit-entropy validate --config configs/grpo_tiny.yaml --model.policy.model_name_or_path path/to/hf_model_dir
    cli = cli_main(["validate", "--config", grpo, "--model.policy.model_name_or_path", str(run / "hf_model"), *FEW])
    assert "val/avg@8" in cli.trainer.callback_metrics
    # lit-entropy test (offered by --help): evaluates on the validation prompts
    cli = cli_main(["test", "--config", grpo, "--ckpt_path", str(last), *FEW])
    assert "test/avg@8" in cli.trainer.callback_metrics

    # lit-entropy fit --config configs/grpo_tiny.yaml --print_config > my.yaml; then --config my.yaml
    capsys.readouterr()
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", grpo, "--print_config"])
    Path("my.yaml").write_text(capsys.readouterr().out)
    cli = cli_main(["fit", "--config", "my.yaml", *FEW, "--trainer.max_steps=1", "--trainer.val_check_interval=1"])
    assert cli.trainer.global_step == 1

    # lit-entropy export --ckpt_path CKPT --out DIR
    out = export_main(["--ckpt_path", str(last), "--out", "exported"])
    assert (Path(out) / "model.safetensors").is_file()

    # the other tiny recipes: Clip_V and PPO (Clip_B runs in test_cli.py)
    for name in ("clip_v_tiny.yaml", "ppo_tiny.yaml"):
        cli = cli_main(
            ["fit", "--config", str(CONFIGS / name), *FEW, "--trainer.max_steps=1", "--trainer.val_check_interval=1"]
        )
        assert cli.trainer.global_step >= 1, name


def test_python_dash_m_and_version():
    """`python -m lit_entropy` works like `lit-entropy`; `lit-entropy --version` prints the version."""
    from lit_entropy import __version__

    done = subprocess.run([sys.executable, "-m", "lit_entropy", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"lit-entropy {__version__}"

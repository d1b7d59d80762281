"""scripts/gpu_check.sh on a machine without CUDA: every command it would run on a GPU parses, and it says so."""

from __future__ import annotations

import pytest

from scripts.bench import gpu_check


def test_cpu_path_parses_every_command(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["gpu_check"])
    assert gpu_check.main(["--cpu-parse"]) == 0
    captured = capsys.readouterr()
    assert "every config parses; the check itself needs a CUDA GPU" in captured.out
    for part in ("hf", "vllm", "fsdp2"):
        assert f"gpu_check: {part}: the command parses" in captured.err


def test_a_command_that_does_not_parse_fails_the_check(monkeypatch, capsys):
    commands = gpu_check.lit_commands
    monkeypatch.setattr(
        gpu_check, "lit_commands", lambda out, gpus: {**commands(out, gpus), "bad": ["fit", "--model.sampling.temp=1"]}
    )
    monkeypatch.setattr("sys.argv", ["gpu_check"])
    assert gpu_check.main(["--cpu-parse"]) == 1
    assert "FAILED to parse: bad" in capsys.readouterr().out


@pytest.mark.parametrize("part", ["hf", "vllm", "fsdp2"])
def test_every_part_runs_ten_bf16_steps_on_the_packaged_model(part, tmp_path):
    args = gpu_check.lit_commands(tmp_path, 4)[part]
    assert "--trainer.max_steps=10" in args and "--model.policy.model_name_or_path=smollm2-135m-instruct" in args
    assert ("--trainer.precision=bf16-mixed" in args) if part == "fsdp2" else ("--model.policy.dtype=bfloat16" in args)
    if part == "fsdp2":
        assert "--trainer.devices=4" in args

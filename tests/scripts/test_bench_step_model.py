"""``scripts.bench.step --model smollm2-135m-instruct``: the packaged model's rounds use ChatML word problems on
lit_entropy's side (settings that parse) and the same rows as conversational prompts on TRL's side."""

from __future__ import annotations

import pytest

from scripts.bench import step


def test_model_option_is_a_packaged_name():
    assert step._parse(["--model", "smollm2-135m-instruct"]).model == "smollm2-135m-instruct"
    with pytest.raises(SystemExit):
        step._parse(["--model", "gpt2"])


def test_lit_side_of_the_chat_task_parses(capsys, monkeypatch):
    from lit_entropy.cli import cli_main

    monkeypatch.setattr("sys.argv", ["lit-entropy"])
    args = ["fit", "--config", str(step.REPO / step.LIT_VARIANTS["grpo"]), *step.CHAT_TASK_OVERRIDES]
    with pytest.raises(SystemExit) as exit_info:
        cli_main([*args, "--model.policy.model_name_or_path=smollm2-135m-instruct", "--print_config"])
    assert exit_info.value.code in (0, None)
    out = capsys.readouterr().out
    assert "train_dataset: word_problems_1op" in out and "apply_chat_template: true" in out

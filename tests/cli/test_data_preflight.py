"""Issue 35 §2, §3: own data on day one. Every data problem is one line naming the ``data.*`` setting, found
before any model is loaded; a validation cadence larger than an epoch is named with both settings and the batch
count; ``trainer.max_steps`` alone decides the length of a run, and the data repeats (exactly resumable)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lightning  # noqa: F401  (imported outside the tests: see tests/cli/test_settings_errors.py)
import pytest
import torch

from lit_entropy.cli import main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
PREFIX = "lit-entropy: error: "


def _rows(path: Path, count: int, prompt: str = "{i}+{i}=") -> str:
    rows = [{"question": prompt.format(i=i), "answer": str(2 * i)} for i in range(count)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path.name


def _never_load_the_model(monkeypatch) -> None:
    from lit_entropy.module import RFTModule

    def refuse(self) -> None:
        raise AssertionError("the model was loaded before the data was checked")

    monkeypatch.setattr(RFTModule, "configure_model", refuse)


def _one_line(command: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(PREFIX)]
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0].removeprefix(PREFIX)


def _own_data(model: str, data: str, *more: str) -> list[str]:
    return [
        "--config", str(GRPO_TINY), f"--model.policy.model_name_or_path={model}", f"--data.train_dataset={data}",
        f"--data.val_dataset={data}", "--data.prompt_key=question", "--trainer.max_steps=10", *more,
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("rows", "prompt", "extra", "expected"),
    [
        # The hint suggests among the columns no other setting reads (main suggested prompt_key's 'question').
        (40, "{i}+{i}=", ["--data.answer_key=solution"],
         "data.answer_key='solution' is not a column of train_dataset='own.jsonl' (available columns: ['question', "
         "'answer']); did you mean 'answer' (the only column not read by prompt_key='question')?"),
        (12, "{i}+{i}=", [],
         "data.batch_size=16 exceeds the 12 training prompts of train_dataset='own.jsonl': no full batch is left "
         "(incomplete batches are dropped); set batch_size to at most 12 or add rows"),
        (40, "what is {i}+{i}?", [],
         "data.train_dataset='own.jsonl': the tokenizer cannot encode the characters '?ahistw' (40 of 40 prompts); "
         "first at row 0 (line 1 of own.jsonl): ['w', 'h', 'a', 't', 'i', 's', '?'] in 'what is 0+0?'. They would "
         "become <unk> and be dropped when decoded; use a model whose tokenizer covers them (tokenizer_name_or_path="
         "'{model}'; lit-entropy: model.policy.model_name_or_path)"),
    ],
    ids=["missing column", "batch larger than the data", "tokenizer cannot encode"],
)  # fmt: skip
def test_a_data_problem_is_one_line_before_the_model_loads(
    rows, prompt, extra, expected, tiny_model_dir, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    _never_load_the_model(monkeypatch)
    data = _rows(tmp_path / "own.jsonl", rows, prompt)
    line = _one_line(["fit", *_own_data(tiny_model_dir, data, *extra)], capsys)
    assert line == expected.replace("{model}", tiny_model_dir)
    assert not list(tmp_path.glob("runs/*/version_*"))  # no run directory left behind


def test_own_data_with_the_embedded_model_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _never_load_the_model(monkeypatch)
    data = _rows(tmp_path / "own.jsonl", 40)
    command = ["fit", "--config", str(GRPO_TINY), f"--data.train_dataset={data}", f"--data.val_dataset={data}"]
    command += ["--data.prompt_key=question"]
    line = _one_line(command, capsys)
    assert line.startswith("data.train_dataset='own.jsonl' / val_dataset='own.jsonl' need the tokenizer of the model")
    assert "set model.policy.model_name_or_path to your model" in line


def test_validate_checks_its_data_before_the_model_loads(tiny_model_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _never_load_the_model(monkeypatch)
    data = _rows(tmp_path / "own.jsonl", 8)
    command = ["validate", *_own_data(tiny_model_dir, data, "--data.answer_key=sol")]
    assert _one_line(command, capsys).startswith("data.answer_key='sol' is not a column of val_dataset='own.jsonl'")


def test_a_validation_interval_longer_than_an_epoch_is_one_line_before_the_model_loads(
    tiny_model_dir, tmp_path, monkeypatch, capsys
):
    """40 rows at batch 16 are 2 batches an epoch; grpo_tiny.yaml validates every 30 (Lightning refused it after
    the model had loaded and the first validation had written runs/own/version_0)."""
    monkeypatch.chdir(tmp_path)
    _never_load_the_model(monkeypatch)
    data = _rows(tmp_path / "own.jsonl", 40)
    line = _one_line(["fit", *_own_data(tiny_model_dir, data, "--trainer.logger.init_args.name=own")], capsys)
    assert line == (
        "trainer.val_check_interval=30 is more than the 2 training batches of an epoch (40 prompts of "
        "data.train_dataset='own.jsonl' at data.batch_size=16); set it to at most 2, or set "
        "trainer.check_val_every_n_epoch=null to count it in batches across epochs"
    )
    assert not list(tmp_path.glob("runs/*/version_*"))  # no run directory left behind


def test_max_steps_alone_decides_the_length_of_a_run(tmp_path, monkeypatch):
    """grpo_tiny.yaml says max_epochs: 3; --trainer.max_steps lifts it (the data repeats as needed)."""
    from lit_entropy.cli import cli_main

    monkeypatch.chdir(tmp_path)
    trainer = cli_main(["--config", str(GRPO_TINY), "--trainer.max_steps=1000"], run=False).trainer
    assert (trainer.max_steps, trainer.max_epochs) == (1000, -1)
    trainer = cli_main(["--config", str(GRPO_TINY)], run=False).trainer
    assert (trainer.max_steps, trainer.max_epochs) == (-1, 3)  # without max_steps the config's epochs count


class _Recorder(lightning.pytorch.LightningModule):
    """Records the answers of every training batch; one optimizer step per batch (global_step counts them)."""

    def __init__(self, seen: list[list[str]]) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen = seen

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.seen.append(list(batch["answers"]))
        return (self.weight * 0.0).sum()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _fit_on_three_batch_epochs(tmp_path: Path, seen: list, ckpt_path: str | None = None) -> None:
    from lightning.pytorch.callbacks import ModelCheckpoint

    from lit_entropy.data.datamodule import PromptDataModule

    data = PromptDataModule(num_train_examples=6, batch_size=2, val_dataset=None, seed=3)  # 3 batches an epoch
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=4, save_top_k=-1)
    trainer = lightning.pytorch.Trainer(
        accelerator="cpu", max_epochs=-1, max_steps=8, logger=False, callbacks=[checkpoints],
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(_Recorder(seen), datamodule=data, ckpt_path=ckpt_path)
    assert trainer.global_step == 8


def test_a_run_longer_than_the_data_repeats_it_and_resumes_exactly_mid_epoch(tmp_path):
    straight: list[list[str]] = []
    _fit_on_three_batch_epochs(tmp_path / "a", straight)  # 8 steps over 3 epochs of 3 batches
    epochs = [straight[i : i + 3] for i in (0, 3)]
    assert all(sorted(a for b in epoch for a in b) == sorted(a for b in epochs[0] for a in b) for epoch in epochs)
    assert epochs[0] != epochs[1]  # each epoch reshuffles
    resumed: list[list[str]] = []
    step_4 = next((tmp_path / "a" / "ckpt").glob("*step=4.ckpt"))  # epoch 1, after its first batch
    _fit_on_three_batch_epochs(tmp_path / "b", resumed, ckpt_path=str(step_4))
    assert resumed == straight[4:]


def test_a_run_of_more_steps_than_the_config_has_epochs_runs_them_all_and_keeps_the_samples_interval(
    tmp_path, monkeypatch
):
    """grpo_tiny.yaml's 3 epochs of 2 batches stop after 6; max_steps=7 runs 7 (4 epochs). Samples every 4 batches
    are logged at 0 and 4 (counted over the run), not at the first batch of every epoch (0, 2, 4, 6)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from lit_entropy.cli import cli_main

    monkeypatch.chdir(tmp_path)
    torch.set_num_threads(1)
    cli = cli_main([
        "fit", "--config", str(GRPO_TINY), "--data.num_train_examples=32", "--trainer.max_steps=7",
        "--val_before_train=false", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
        "--trainer.enable_checkpointing=false", "--model.logging.export_on_train_end=false",
        "--model.logging.log_samples_every_n_steps=4",
    ])  # fmt: skip
    assert cli.trainer.global_step == 7  # main stopped after the config's 3 epochs of 2 batches: 6
    events = EventAccumulator(str(next((tmp_path / "runs").glob("*/version_0"))), size_guidance={"tensors": 0})
    events.Reload()
    assert [event.step for event in events.Tensors("train/samples/text_summary")] == [0, 4]


def test_a_logging_interval_longer_than_an_epoch_is_not_warned_about():
    """Logging counts batches over the run; Lightning's warning that a short epoch logs nothing does not apply."""
    import warnings
    from types import SimpleNamespace

    from lit_entropy.cli.preflight import check_cadences

    trainer = SimpleNamespace(
        val_check_interval=1.0, check_val_every_n_epoch=1, limit_val_batches=1.0, limit_train_batches=1.0,
        log_every_n_steps=10,
    )  # fmt: skip
    data = SimpleNamespace(train_batches_per_epoch=lambda world_size: 2)
    lightnings = (
        "The number of training batches (2) is smaller than the logging interval Trainer(log_every_n_steps=10). Set a "
        "lower value for log_every_n_steps if you want to see logs for the training epoch."
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_cadences(trainer, data, 1)
        warnings.warn(lightnings, UserWarning, stacklevel=1)
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(warning.message) for warning in caught] == ["another warning"]

"""Issue 35 §6 and §10: a run that fails before its first step leaves no version directory; runs started at
once take distinct ones."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from lit_entropy.cli import cli_main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
SHORT = [
    "--trainer.enable_progress_bar=false",
    "--trainer.val_check_interval=2",
    "--data.num_train_examples=32",
    "--data.num_val_examples=8",
    "--data.val_batch_size=8",
]


@pytest.mark.parametrize("val_before_train", [True, False])
def test_a_run_that_fails_before_its_first_step_leaves_no_version_directory(tmp_path, monkeypatch, val_before_train):
    from lit_entropy.rewards import RewardFunctionError

    monkeypatch.chdir(tmp_path)
    (tmp_path / "broken_reward.py").write_text("def score(completions, answers):\n    raise KeyError('answer')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    failing = ["fit", "--config", str(GRPO_TINY), *SHORT, "--model.reward.fn=broken_reward:score"]
    with pytest.raises(RewardFunctionError):
        cli_main([*failing, f"--val_before_train={str(val_before_train).lower()}"])
    root = tmp_path / "runs" / "grpo_tiny"
    assert not root.exists() or not list(root.iterdir()), sorted(p.name for p in root.rglob("*"))
    cli_main(["fit", "--config", str(GRPO_TINY), *SHORT, "--trainer.max_steps=1", "--val_before_train=false"])
    assert sorted(p.name for p in root.iterdir()) == ["version_0"]  # the failed run's number is reused


def test_runs_started_at_once_take_distinct_version_directories(tmp_path, monkeypatch):
    """Each run lists the directory before creating its own (Lightning's rule): all of them see version_0 free."""
    from lightning.pytorch.loggers import TensorBoardLogger

    from lit_entropy.cli.run_dir import claim_version_dirs

    class Run:
        def __init__(self) -> None:
            self.loggers = [TensorBoardLogger(save_dir=str(tmp_path), name="same")]

    runs = [Run() for _ in range(6)]
    assert {run.loggers[0]._get_next_version() for run in runs} == {0}  # what each would have taken
    barrier = threading.Barrier(len(runs))
    monkeypatch.setattr(TensorBoardLogger, "_get_next_version", lambda self: (barrier.wait(), 0)[1])
    threads = [threading.Thread(target=claim_version_dirs, args=(run,)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(run.loggers[0].log_dir for run in runs) == [str(tmp_path / "same" / f"version_{n}") for n in range(6)]
    assert sorted(p.name for p in (tmp_path / "same").iterdir()) == [f"version_{n}" for n in range(6)]

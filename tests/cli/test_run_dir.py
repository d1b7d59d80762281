"""Issue 21 §1: a resumed fit and a validation of a checkpoint stay inside the run they belong to."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

from lit_entropy.cli import cli_main

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
SHORT = [
    "--trainer.enable_progress_bar=false",
    "--trainer.val_check_interval=2",
    "--data.num_train_examples=64",
    "--data.num_val_examples=16",
    "--data.val_batch_size=16",
]


def _scalars(log_dir: Path) -> dict[str, list[int]]:
    """Every scalar tag's steps as TensorBoard shows them (restart marks applied) in ``log_dir`` itself."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_resume_from_the_runs_own_config_continues_its_directory_and_validate_logs_inside_it(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli_main(["fit", "--config", str(GRPO_TINY), *SHORT, "--trainer.max_steps=4"])
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    checkpoints = run / "checkpoints"
    shutil.copy(checkpoints / "last.ckpt", checkpoints / "after_4.ckpt")  # resumed again below, after the run went on
    # exactly what the resume refusal recommends: the run's own config.yaml (its nulls are not changes)
    resume = ["fit", "--config", str(run / "config.yaml"), *SHORT[:1], f"--ckpt_path={checkpoints / 'last.ckpt'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main([*resume, "--trainer.max_steps=6"])
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    assert sorted(p.name for p in (tmp_path / "runs" / "grpo_tiny").iterdir()) == ["version_0"]
    assert (run / "config_resumed_step_4.yaml").is_file() and (run / "config.yaml").is_file()
    steps = _scalars(run)
    assert steps["train/reward/mean"] == [0, 1, 2, 3, 4, 5]
    assert steps["val/avg@8"] == [0, 2, 4, 6]  # before training, then after every 2 batches
    for tag, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{tag} has a step twice: {logged}"

    # from an older checkpoint of the same run: what the run logged after it is dropped, not duplicated
    cli_main(
        [
            "fit",
            "--config",
            str(run / "config.yaml"),
            *SHORT[:1],
            f"--ckpt_path={checkpoints / 'after_4.ckpt'}",
            "--trainer.max_steps=5",
        ]
    )
    steps = _scalars(run)
    assert steps["train/reward/mean"] == [0, 1, 2, 3, 4] and steps["val/avg@8"] == [0, 2, 4]

    # validating a checkpoint: a run of its own inside the training run, at the checkpoint's step
    validate = ["validate", "--config", str(run / "config.yaml"), f"--ckpt_path={checkpoints / 'after_4.ckpt'}"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cli_main(validate)
        cli_main(validate)
    assert not [w for w in caught if "dirpath has changed" in str(w.message)]
    assert _scalars(run / "validate_step_4")["val/avg@8"] == [4]
    assert _scalars(run / "validate_step_4_2")["val/avg@8"] == [4]  # validated again: a new name, no overwrite
    assert sorted(p.name for p in (tmp_path / "runs" / "grpo_tiny").iterdir()) == ["version_0"]


#: What SLURM sets in a one-task job (Lightning's SLURMEnvironment.detect() then holds, without SLURM itself).
SLURM_JOB = {
    "SLURM_NTASKS": "1",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_JOB_NAME": "grpo",
    "SLURM_JOB_ID": "4242",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "0",
    "SLURM_NODELIST": "localhost",
}


def test_a_requeued_slurm_job_continues_in_its_own_run_directory(tmp_path, monkeypatch):
    """Under SLURM auto-requeue Lightning resumes the requeued job (the same command, no --ckpt_path) from the
    newest ``<default_root_dir>/hpc_ckpt_<N>.ckpt``: it logs into the stopped run's version, not a new one.

    The requeue signal itself (SIGUSR1 -> ``hpc_ckpt_1.ckpt`` + ``scontrol requeue``) is tested in
    ``tests/checkpointing/test_resume.py``; here the stopped job's checkpoint is put where that signal writes it.
    """
    import torch
    from lightning.fabric.plugins.environments import SLURMEnvironment

    monkeypatch.chdir(tmp_path)
    command = ["fit", "--config", str(GRPO_TINY), *SHORT]
    cli_main([*command, "--trainer.max_steps=4"])  # the job, stopped after 4 batches
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    # trainer.save_checkpoint at the end of batch 4, as the requeue signal's handler does, into default_root_dir
    shutil.copy(run / "checkpoints" / "last.ckpt", tmp_path / "hpc_ckpt_1.ckpt")
    recorded = torch.load(tmp_path / "hpc_ckpt_1.ckpt", map_location="cpu", weights_only=True)
    assert recorded["lit_entropy_log_dir"] == str(run.resolve())  # the checkpoint knows its run
    for key, value in SLURM_JOB.items():
        monkeypatch.setenv(key, value)
    assert SLURMEnvironment.detect()
    cli_main([*command, "--trainer.max_steps=6"])  # the requeued job
    assert sorted(p.name for p in (tmp_path / "runs" / "grpo_tiny").iterdir()) == ["version_0"]
    assert (run / "config_resumed_step_4.yaml").is_file() and (run / "config.yaml").is_file()
    steps = _scalars(run)
    assert steps["train/reward/mean"] == [0, 1, 2, 3, 4, 5]  # continued from the checkpoint's step
    assert steps["val/avg@8"] == [0, 2, 4, 6]
    for tag, logged in steps.items():
        assert len(logged) == len(set(logged)), f"{tag} has a step twice: {logged}"

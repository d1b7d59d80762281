"""scripts/docs/word_problem_runs.py: the run commands, and before/after figures read back from event files."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _scripts import load_script


def test_run_commands_are_the_configs_sized_down():
    runs = load_script("scripts.docs.word_problem_runs")
    grpo = runs.run_command("grpo", 1, 2, Path("/tmp/out"))
    clip_b = runs.run_command("clip_b", 1, 2, Path("/tmp/out"))
    assert grpo[1:5] == ["-m", "lit_entropy", "fit", "--config=configs/smollm2_word_problems.yaml"]
    assert "--config=configs/smollm2_word_problems_clip_b.yaml" in clip_b
    for command in (grpo, clip_b):
        assert {"--seed_everything=1", "--trainer.max_steps=2", "--trainer.val_check_interval=2"} <= set(command)
        assert set(runs.SIZING) <= set(command)
    # only Clip_B skips the step-0 validation (the GRPO run of its seed validated the same start)
    assert "--val_before_train=false" in clip_b and "--val_before_train=false" not in grpo
    assert "--trainer.logger.init_args.name=clip_b_s1" in clip_b


def write_run(directory: Path, val: dict[int, tuple[float, float]], steps: int) -> None:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(directory))
    for step, (avg, passed) in val.items():
        writer.add_scalar("val/avg@4", avg, step)
        writer.add_scalar("val/pass@4", passed, step)
    for step in range(steps):  # phase seconds of training batch `step`
        for offset, phase in enumerate(("generate", "score", "statistics", "update")):
            writer.add_scalar(f"perf/time_{phase}_s", 10.0 * (step + 1) + offset, step)
    writer.close()


def test_collect_and_tables(tmp_path):
    pytest.importorskip("tensorboard")
    runs = load_script("scripts.docs.word_problem_runs")
    seeds_val = {0: ((0.0625, 0.25), (0.125, 0.5), (0.25, 0.5)), 1: ((0.125, 0.25), (0.125, 0.25), (0.0, 0.0))}
    for seed, (start, grpo_end, clip_end) in seeds_val.items():
        write_run(tmp_path / f"grpo_s{seed}" / "version_0", {0: start, 2: grpo_end}, steps=2)
        write_run(tmp_path / f"clip_b_s{seed}" / "version_0", {2: clip_end}, steps=2)  # no step-0 validation

    # seed 2: the GRPO run validated its start but was stopped before its end; Clip_B never started
    write_run(tmp_path / "grpo_s2" / "version_0", {0: (0.5, 1.0)}, steps=1)

    collected = runs.collect(tmp_path, [0, 1, 2])
    assert collected["grpo_s2"] == {"method": "grpo", "seed": 2, "unfinished": True}
    assert collected["clip_b_s2"] == {"method": "clip_b", "seed": 2, "unfinished": True}
    clip_b0 = collected["clip_b_s0"]
    assert clip_b0["steps"] == 2
    assert clip_b0["before"] == {"val/avg@4": 0.0625, "val/pass@4": 0.25}  # the GRPO run's step 0, same seed
    assert clip_b0["after"] == {"val/avg@4": 0.25, "val/pass@4": 0.5}
    # step i's phases: 10 (i + 1) + 0, +1, +2, +3 -> 40 (i + 1) + 6
    assert clip_b0["step_seconds"] == [46.0, 86.0]

    table = runs.tables(collected)
    assert "| clip_b | 0 | 2 | 0.062 | 0.250 | 0.250 | 0.500 | 46 / 86 |" in table
    # GRPO avg@4 before: seeds 0.0625, 0.125 -> mean 0.09375; t_{0.975,1} = 12.706, sd = 0.0625 / sqrt(2)
    half = 12.7062047 * (0.0625 / math.sqrt(2)) / math.sqrt(2)
    low, high = 0.09375 - half, 0.09375 + half
    assert "| grpo | 2 | not finished | | | | | |" in table
    row = next(line for line in table.splitlines() if line.startswith("| grpo | `val/avg@4`"))
    assert row.startswith("| grpo | `val/avg@4` | 2 | ")  # the unfinished seed is left out of the mean
    assert f"0.094 [{low:.3f}, {high:.3f}]" in row
    # after - before per seed: +0.0625, 0 -> mean +0.031
    assert row.split(" | ")[-1].startswith("+0.031 [")


def test_easy_variant_runs_its_own_config_and_reads_one_start(tmp_path):
    pytest.importorskip("tensorboard")
    runs = load_script("scripts.docs.word_problem_runs")
    first = runs.run_command("grpo_easy", 0, 10, Path("/tmp/out"), validate_start=True)
    later = runs.run_command("grpo_easy", 1, 10, Path("/tmp/out"), validate_start=False)
    assert "--config=configs/smollm2_word_problems_easy.yaml" in first
    assert "--val_before_train=false" not in first and "--val_before_train=false" in later
    # the easy config is sized already (16 tokens, 2 prompts): only checkpointing is turned off
    assert set(runs.SIZING) & set(first) == {"--trainer.enable_checkpointing=false"}

    write_run(tmp_path / "grpo_easy_s0" / "version_0", {0: (0.125, 0.5), 3: (0.25, 0.75)}, steps=3)
    write_run(tmp_path / "grpo_easy_s1" / "version_0", {3: (0.5, 1.0)}, steps=3)  # no step-0 validation
    collected = runs.collect(tmp_path, [0, 1], ("grpo_easy",), once=True)
    assert collected["grpo_easy_s1"]["before"] == {"val/avg@4": 0.125, "val/pass@4": 0.5}  # seed 0's start
    assert collected["grpo_easy_s1"]["after"] == {"val/avg@4": 0.5, "val/pass@4": 1.0}
    row = next(line for line in runs.tables(collected).splitlines() if line.startswith("| grpo_easy | `val/avg@4`"))
    assert row.split(" | ")[-1].startswith("+0.250 [")  # after - before: +0.125, +0.375
    table = runs.curves(tmp_path, collected)
    assert set(table["run"]) == {"grpo_easy_s0", "grpo_easy_s1"}
    # seed 1: 2 validation points + 3 steps x 4 phases
    assert len(table[table["run"] == "grpo_easy_s1"]) == 2 + 12

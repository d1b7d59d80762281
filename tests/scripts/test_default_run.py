"""scripts/docs/default_run.py (issue 35 §8): the figures docs quote come from one run of the default, and every doc
holds each quote with the committed JSON's numbers."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _scripts import load_script

REPO = Path(__file__).resolve().parents[2]
SHORT = [
    "--trainer.max_steps=2", "--trainer.val_check_interval=1", "--data.num_val_examples=8",
    "--data.val_batch_size=8", "--model.logging.export_on_train_end=false", "--trainer.enable_checkpointing=false",
]  # fmt: skip


def test_the_generator_runs_the_command_and_keeps_what_the_event_files_hold(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    generator = load_script("scripts.docs.default_run")
    out = tmp_path / "figures.json"
    kept: list[Path] = []
    run_default = generator.run_default

    def keep_the_run(workdir: Path, extra: list[str]) -> dict:
        run = run_default(workdir, extra)
        kept.append(Path(shutil.copytree(run["run_dir"], tmp_path / "run")))
        return run

    generator.run_default = keep_the_run
    generator.main(["--out", str(out), "--steps", "0", "1", "2", "--", *SHORT])
    figures = json.loads(out.read_text())
    assert json.loads(capsys.readouterr().out) == figures  # what it prints is what it writes
    assert figures["command"] == "lit-entropy fit --config configs/grpo_tiny.yaml " + " ".join(SHORT)
    assert figures["wall_s"] > 0 and figures["cpu_s"] > 0 and len(figures["load"]) == 3
    # The values are the event files' (read here without the generator's reader): validations at 0, 1, 2;
    # training scalars at batches 0 and 1, so step 2 shows batch 1's.
    events = EventAccumulator(str(kept[0]), size_guidance={"scalars": 0})
    events.Reload()
    logged = {tag: {e.step: e.value for e in events.Scalars(tag)} for tag in events.Tags()["scalars"]}
    for tag in ("val/avg@8", "val/pass@8", "val/pass@2"):
        assert figures["at"][tag] == {str(step): logged[tag][step] for step in (0, 1, 2)}
        assert figures["best"][tag] == max(logged[tag].values())
    for tag in ("train/entropy/mean", "train/reward/mean"):
        assert figures["at"][tag] == {"0": logged[tag][0], "1": logged[tag][1], "2": logged[tag][1]}

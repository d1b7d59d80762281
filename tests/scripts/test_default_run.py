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


def _figures(avg_end: float) -> dict:
    steps = ["0", "60", "270"]
    at = {tag: dict(zip(steps, values, strict=True)) for tag, values in {
        "val/avg@8": (0.25, 0.5, avg_end), "val/pass@8": (0.75, 0.875, 0.9), "val/pass@2": (0.4, 0.5, 0.625),
        "train/entropy/mean": (0.351, 0.3, 0.2049), "train/reward/mean": (0.5, 0.6, 0.7),
    }.items()}  # fmt: skip
    best = {"val/avg@8": max(0.5, avg_end), "val/pass@8": 0.9, "val/pass@2": 0.625}
    return {
        "commit": "abc1234", "cpus": 2, "load": [3.14, 2.0, 1.0], "wall_s": 181.0, "cpu_s": 300.4,
        "steps": [0, 60, 270], "at": at, "best": best,
    }  # fmt: skip


def test_the_docs_are_rewritten_with_new_figures_and_only_the_numbers_change(tmp_path):
    generator = load_script("scripts.docs.default_run")
    for path in {quote.path for quote in generator.QUOTES}:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / path, tmp_path / path)
    before = {path: (tmp_path / path).read_text() for path in {quote.path for quote in generator.QUOTES}}
    figures = _figures(0.6666)
    changed = generator.update_docs(figures, root=tmp_path)
    assert generator.check_docs(figures, root=tmp_path) == []
    assert set(changed) == set(before)
    readme = (tmp_path / "README.md").read_text()
    assert "The default run took 3.0 min (300 CPU seconds) on 2 CPU\ncores, started at load 3.1" in readme  # wrap kept
    assert "rises from 0.25 to 0.67" in readme and "falls from 0.35 to 0.20 nats" in readme
    assert "| `val/avg@8` | 0.250 | 0.500 | 0.667 (best 0.667) |" in (tmp_path / "docs/study.md").read_text()
    for path, text in before.items():
        assert len((tmp_path / path).read_text().splitlines()) == len(text.splitlines())
    # A doc that disagrees is named with the quote's field and both values.
    problems = generator.check_docs(_figures(0.5), root=tmp_path)
    assert "README.md: avg_end is '0.67', the figures say '0.50'" in problems


def test_the_docs_quote_the_committed_figures():
    """The committed JSON is what the generator printed for the commit it names; every doc quotes it."""
    generator = load_script("scripts.docs.default_run")
    figures = json.loads(generator.FIGURES.read_text())
    assert not figures["commit"].endswith("-dirty")
    assert figures["command"] == "lit-entropy fit --config configs/grpo_tiny.yaml" and figures["steps"] == [0, 60, 270]
    assert generator.check_docs(figures) == []

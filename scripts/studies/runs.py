"""One study run's training and its record, shared by the study runners (``scripts.studies.{horizon,sod}.run``)."""

from __future__ import annotations

import csv
import json
import time
from pathlib import Path
from typing import Any

import torch

from scripts.studies.results import collect

__all__ = ["fit_and_record", "write_csv"]


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    """``rows`` as a CSV file with a header, written atomically (nothing when there are no rows)."""
    if not rows:
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def fit_and_record(
    cli: Any,
    recorder: Any,
    eval_rows: list[dict[str, Any]],
    replay: Any,
    run_dir: Path,
    steps: int,
    revision: str,
    updates_per_batch: int = 1,
) -> None:
    """Train ``cli``'s model for ``steps`` rollout batches (``steps x updates_per_batch`` optimizer steps), then
    write ``run_dir/{eval.csv,train.csv,done.json}`` (the recorder's per-batch rows, the evaluations, seconds, code
    revision, torch, threads, the replay's shortfall and, when above 1, the updates per batch) and fold the run
    into its experiment's table (``run_dir``'s grandparent)."""
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - t0
    if int(cli.trainer.global_step) != steps * updates_per_batch or len(recorder.rows) != steps:
        # Lightning ends fit() quietly on SIGTERM: an interrupted run must not be marked done.
        raise RuntimeError(
            f"{run_dir.name} stopped at optimizer step {cli.trainer.global_step} of {steps * updates_per_batch} "
            f"({len(recorder.rows)} of {steps} rollout batches); not done"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    write_csv(run_dir / "eval.csv", eval_rows)
    write_csv(run_dir / "train.csv", recorder.rows)
    done = {
        "seconds": round(seconds, 1),
        "steps": steps,
        "code_revision": revision,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "replay_shortfall": None if replay is None else replay.shortfall,
    }
    if updates_per_batch > 1:
        done["updates_per_batch"] = updates_per_batch
    (run_dir / "done.json").write_text(json.dumps(done) + "\n")  # last: the run counts as finished once it exists
    collect(run_dir.parent.parent)  # into the experiment's runs.parquet

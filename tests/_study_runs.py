"""Hand-made study runs for the analysis tests (``tests/scripts``), and the check of a count-replaying control.

A run is written as the study runners write it: ``<exp>/per_run/<name>/{eval.csv,train.csv,done.json}``.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

Role = tuple[float, int, float, int]  # entropy, masked tokens, masked negative share, tokens


def write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def train_row(step: int, strategy: Role, execution: Role) -> dict[str, Any]:
    """One ``train.csv`` row: reward 0.5, then per token role its entropy, masked count, masked share and tokens."""
    row: dict[str, Any] = {"step": step, "reward_mean": 0.5}
    for role, (entropy, masked, negative, tokens) in (("strategy", strategy), ("exec", execution)):
        row |= {f"entropy_{role}": entropy, f"masked_n_{role}": masked, f"masked_neg_{role}": negative}
        row[f"tokens_{role}"] = tokens
    return row


def sod_eval_rows(p: float) -> list[dict[str, Any]]:
    """``eval.csv`` rows of a sum-or-difference run: two test prompts (sum, diff) at steps 0, 40, 80, 120, with
    p(correct) 0.5 at step 0 and ``p`` at the last three."""
    rows = []
    for step in (0, 40, 80, 120):
        for prompt, cls in (("1,2?", "sum"), ("5,3?", "diff")):
            q = 0.5 if step == 0 else p
            rows.append(
                {"step": step, "temperature": 1.0, "prompt": prompt, "class": cls, "logp": math.log(q), "logp_R": -1.0}
            )
    return rows


def write_run(
    exp: Path,
    name: str,
    eval_rows: list[dict[str, Any]],
    train_rows: list[dict[str, Any]],
    rev: str = "abc1234",
    seconds: float = 60.0,
    replay_shortfall: int | None = None,
) -> None:
    """A finished run ``name`` of ``exp`` (one ``train_rows`` row per step) at code revision ``rev``."""
    d = exp / "per_run" / name
    d.mkdir(parents=True)
    write_csv(d / "eval.csv", eval_rows)
    write_csv(d / "train.csv", train_rows)
    done = {"seconds": seconds, "steps": len(train_rows), "code_revision": rev, "torch": "t", "threads": 1}
    (d / "done.json").write_text(json.dumps({**done, "replay_shortfall": replay_shortfall}))


def assert_replays_counts(clip_b: Path, replay: Path) -> None:
    """The replay run masked, at every step, as many tokens as the Clip_B run it replays."""
    train = [list(csv.DictReader((d / "train.csv").open())) for d in (clip_b, replay)]
    for a, b in zip(*train, strict=True):
        total = int(a["masked_n_strategy"]) + int(a["masked_n_exec"])
        assert int(b["masked_n_strategy"]) + int(b["masked_n_exec"]) == total

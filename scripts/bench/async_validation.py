"""Validation curves of the embedded default, synchronous (``max_staleness: 0``, the same run bit for bit) against
one-step off-policy (``model.sampling.async_rollout.max_staleness: 1``), over several seeds.

Each run is ``lit-entropy fit --config configs/grpo_tiny.yaml --seed_everything SEED`` in its own process (niced,
``--threads`` intra-op threads), with validation every ``--val-every`` steps on the first ``--val-examples`` prompts
of the validation split; ``val/avg@8`` at each validation step is read from its event file. The table lists each
setting's mean and range over the seeds per step, and the final difference with its spread; ``--out`` writes every
curve as JSON.

    nice python -m scripts.bench.async_validation --seeds 0 1 2 --out async_validation.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scripts.docs.run_summary import read_scalars

REPO = Path(__file__).resolve().parents[2]
SETTINGS = {"staleness 0": [], "staleness 1": ["--model.sampling.async_rollout.max_staleness", "1"]}

__all__ = ["main", "run_curve"]


def run_curve(seed: int, extra: list[str], logs: Path, args: argparse.Namespace) -> dict[int, float]:
    """``val/avg@8`` by step of one run of the default with ``extra`` settings."""
    cmd = [sys.executable, "-m", "lit_entropy", "fit", "--config", str(REPO / "configs" / "grpo_tiny.yaml")]
    cmd += ["--seed_everything", str(seed), "--trainer.val_check_interval", str(args.val_every)]
    cmd += ["--data.num_val_examples", str(args.val_examples), "--data.val_batch_size", str(args.val_examples)]
    cmd += ["--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false"]
    cmd += ["--model.logging.export_on_train_end", "false", "--val_before_train", "true"]
    cmd += ["--trainer.logger.init_args.save_dir", str(logs), *extra]
    threads = str(args.threads)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    (run_dir,) = logs.glob("*/version_0")
    return {step: value for step, value in read_scalars(run_dir)["val/avg@8"]}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--val-every", type=int, default=90, help="validation interval in steps (the default: 30)")
    parser.add_argument("--val-examples", type=int, default=90, help="validation prompts (the default: 180)")
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per run")
    parser.add_argument("--out", type=Path, default=None, help="write every curve as JSON")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    curves: dict[str, dict[int, dict[int, float]]] = {name: {} for name in SETTINGS}
    start, load = time.time(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:  # interleaved: a load change hits both settings alike
            for name, extra in SETTINGS.items():
                curves[name][seed] = run_curve(seed, extra, Path(tmp) / f"{name.replace(' ', '')}-{seed}", args)
                print(f"{name} seed {seed}: " + ", ".join(f"{s}: {v:.3f}" for s, v in curves[name][seed].items()))
    steps = sorted(set.intersection(*(set(c) for runs in curves.values() for c in runs.values())))
    print(f"\nval/avg@8 ({args.val_examples} validation prompts), mean [min, max] over seeds {args.seeds}")
    print("| step | " + " | ".join(SETTINGS) + " |\n|---|" + "---|" * len(SETTINGS))
    for step in steps:
        cells = []
        for name in SETTINGS:
            values = [curves[name][seed][step] for seed in args.seeds]
            cells.append(f"{sum(values) / len(values):.3f} [{min(values):.3f}, {max(values):.3f}]")
        print(f"| {step} | " + " | ".join(cells) + " |")
    final = steps[-1]
    diffs = [curves["staleness 1"][s][final] - curves["staleness 0"][s][final] for s in args.seeds]
    print(f"\nfinal (step {final}) staleness 1 - staleness 0 per seed: " + ", ".join(f"{d:+.3f}" for d in diffs))
    minutes = (time.time() - start) / 60
    print(f"code {commit.stdout.strip()}, {minutes:.1f} min wall, load average {load:.1f} at the start")
    if args.out is not None:
        record = {"commit": commit.stdout.strip(), "load_at_start": load, "wall_min": minutes, "args": vars(args)}
        record["curves"] = {name: {str(s): c for s, c in runs.items()} for name, runs in curves.items()}
        args.out.write_text(json.dumps(record, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()

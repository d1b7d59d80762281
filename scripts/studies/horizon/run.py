"""Horizon and short-execution forking studies (issue 24, experiments A and B): GRPO vs Clip_B vs a
count-replaying random mask on the four-strategy forking task.

The first forking study (``scripts/studies/forking/run.py``: four-strategy task, base models fork-s0 / fork-s1) ran
80 steps. Experiment A (``--experiment horizon``) reruns its task and base models for 400 steps under the
statistics of the sum-or-difference study. Experiment B (``--experiment short``) runs the same task with one copy
of the payload per response (8 tokens) from base models built for it, for 300 steps. Designs, endpoints and
decision rules are fixed in ``scripts/forking/experiments/<experiment>/PREREGISTRATION.md`` (each committed before
its first run).

Each run trains one arm from one base model with one RL seed (``configs/forking/base.yaml`` + the experiment's and
the arm's overlays) and evaluates the policy exactly on the 64 test prompts (16 per class) at T = 1.0. Every
prompt has one correct response, so p = its sequence probability (teacher forcing), avg@k = p and
pass@k = 1 - (1 - p)^k (``forking_study.correct_logprob``). Per run it writes
``<exp>/per_run/<base>__<arm>__s<seed>/{eval.csv,train.csv,done.json}``; a finished run is skipped, so the
study resumes from what is there.

    python -m scripts.studies.horizon --status                      # done / todo per run
    nice -n 19 python -m scripts.studies.horizon --run --workers 2  # run what is missing (resumable)
    python -m scripts.studies.horizon --analyze --update-readme     # tables, verdicts, generated blocks
    python -m scripts.studies.horizon --experiment short --status   # experiment B (likewise --run, --analyze)

Arms: ``grpo``; ``clip_b`` (mu 2.5); ``replay_mask`` (at every step, as many random A < 0 tokens as the Clip_B
run of the same base and seed masked at that step); ``grpo_null`` (GRPO, data order from seed + 1000).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from scripts.studies.controls import ReplayedCountMasking, RoleRecorder, read_counts
from scripts.studies.forking.run import correct_logprob
from scripts.studies.results import is_finished, run_rows
from scripts.studies.runs import fit_and_record
from scripts.studies.sod.run import claim

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS_DIR = ROOT / "scripts" / "forking" / "experiments"
EXP = EXPERIMENTS_DIR / "horizon"
CONFIGS = ROOT / "configs" / "forking"
MODELS = ROOT / "scripts" / "forking" / "models"
DATA = ROOT / "scripts" / "forking" / "data" / "forking"
#: Experiment -> its directory, base models, data, extra config overlays, steps and evaluation interval.
EXPERIMENTS = {
    "horizon": {"exp": EXP, "models": MODELS, "data": DATA, "overlays": (), "steps": 400, "eval_every": 40},
    "short": {
        "exp": EXPERIMENTS_DIR / "short",
        "models": EXPERIMENTS_DIR / "short" / "models",
        "data": EXPERIMENTS_DIR / "short" / "data" / "forking",
        "overlays": ("short.yaml",),
        "steps": 300,
        "eval_every": 30,
    },
}
#: Arm -> method overlay on configs/forking/base.yaml.
ARMS = {"grpo": "grpo.yaml", "clip_b": "clip_b.yaml", "replay_mask": "grpo.yaml", "grpo_null": "grpo.yaml"}
PRIMARY_ARMS = ("grpo", "clip_b", "replay_mask")
BASES = ("fork-s0", "fork-s1")
SEEDS = (0, 1, 2, 3, 4)
NULL_DATA_SEED_OFFSET = 1000
#: Paths whose last commit is the code revision a run records (results commits do not change it).
CODE_PATHS = (
    "lit_entropy",
    "configs/forking",
    "scripts/forking/models",
    "scripts/forking/data",
    "scripts/forking/experiments/short/models",
    "scripts/forking/experiments/short/data",
    "scripts/studies/horizon/run.py",
    "scripts/studies/sod/run.py",
    "scripts/studies/forking/run.py",
    "scripts/studies/forking/design.py",
    "scripts/studies/controls.py",
    "scripts/studies/runs.py",
    "scripts/studies/tasks",
)

Key = tuple[str, str, int]  # (base, arm, seed)


def run_name(base: str, arm: str, seed: int) -> str:
    return f"{base}__{arm}__s{seed}"


def code_revision() -> str:
    """Last commit that touched :data:`CODE_PATHS`, ``+dirty`` when they have uncommitted changes
    (``FORKING_CODE_REV`` where the copy has no git history)."""
    if os.environ.get("FORKING_CODE_REV"):
        return os.environ["FORKING_CODE_REV"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    rev = git("log", "-1", "--format=%h", "--", *CODE_PATHS) or "unknown"
    return rev + ("+dirty" if git("status", "--porcelain", "--", *CODE_PATHS) else "")


def cli_args(key: Key, steps: int, run_dir: Path, experiment: str = "horizon") -> list[str]:
    base, arm, seed = key
    spec = EXPERIMENTS[experiment]
    data_seed = seed + NULL_DATA_SEED_OFFSET if arm == "grpo_null" else seed
    configs = ["base.yaml", *spec["overlays"], ARMS[arm]]
    return [
        *(arg for name in configs for arg in ("--config", str(CONFIGS / name))),
        f"--seed_everything={seed}",
        f"--trainer.max_steps={steps}",
        f"--data.seed={data_seed}",
        f"--trainer.default_root_dir={run_dir}",
        "--val_before_train=false",
        f"--model.policy.model_name_or_path={spec['models'] / base}",
        f"--data.train_dataset={spec['data'] / 'train.jsonl'}",
    ]


def test_rows(data: Path = DATA) -> list[dict[str, str]]:
    return [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines() if line.strip()]


def evaluate(
    policy: Any, tokenizer: Any, step: int, temperature: float = 1.0, data: Path = DATA
) -> list[dict[str, Any]]:
    """One row per test prompt: log p(correct response) and log p(first token = the right strategy)."""
    rows = test_rows(data)
    logp, logp_first = correct_logprob(policy, tokenizer, rows, temperature)
    return [
        {
            "step": step,
            "temperature": temperature,
            "prompt": r["prompt"],
            "class": r["class"],
            "logp": f"{lp:.6g}",
            "logp_first": f"{lf:.6g}",
        }
        for r, lp, lf in zip(rows, logp, logp_first, strict=True)
    ]


def train_one(key: Key, steps: int, eval_every: int, exp: Path, experiment: str = "horizon") -> None:
    from lit_entropy.cli import cli_main

    base, arm, seed = key
    run_dir = exp / "per_run" / run_name(*key)
    scratch = Path(os.environ.get("FORKING_SCRATCH", f"/tmp/forking_{experiment}")) / run_name(*key)
    cli = cli_main(args=cli_args(key, steps, scratch, experiment), run=False)
    eval_rows: list[dict[str, Any]] = []
    data = EXPERIMENTS[experiment]["data"]

    def on_step(step: int, pl_module: Any) -> None:
        if step % eval_every == 0 or step == steps:
            eval_rows.extend(evaluate(pl_module.policy, pl_module.tokenizer, step, data=data))

    recorder = RoleRecorder(on_step)
    cli.trainer.callbacks.append(recorder)
    replay = None
    if arm.startswith("replay"):
        replay = ReplayedCountMasking(read_counts(run_rows(exp, run_name(base, "clip_b", seed), "train")), seed=seed)
        cli.trainer.callbacks.append(replay)
    fit_and_record(cli, recorder, eval_rows, replay, run_dir, steps, code_revision())


def planned(bases: tuple[str, ...], arms: tuple[str, ...], seeds: tuple[int, ...]) -> list[Key]:
    """Seed-major, then base, then arm (primary arms first, Clip_B before the replay that reads its counts);
    ``grpo_null`` runs after every primary run. A study cut short thus has whole (base, seed) units."""
    order = [a for a in ARMS if a in arms]
    primary = [(b, a, s) for s in seeds for b in bases for a in order if a in PRIMARY_ARMS]
    return primary + [(b, a, s) for s in seeds for b in bases for a in order if a not in PRIMARY_ARMS]


def is_done(exp: Path, key: Key) -> bool:
    return is_finished(exp, run_name(*key))


def ready(exp: Path, key: Key) -> bool:
    base, arm, seed = key
    return not arm.startswith("replay") or is_done(exp, (base, "clip_b", seed))


def status(exp: Path, keys: list[Key]) -> None:
    for key in keys:
        d = exp / "per_run" / run_name(*key)
        if is_done(exp, key):
            info = json.loads((d / "done.json").read_text())
            state = f"done  {info['seconds']:7.0f}s  code {info['code_revision']}  torch {info['torch']}"
        else:
            state = "claimed (running?)" if (d / "claim").exists() else "todo"
        print(f"{run_name(*key):28s} {state}")


def execute(args: argparse.Namespace, keys: list[Key]) -> None:
    """Run the missing runs of ``keys`` in this process, in order."""
    for key in keys:
        d = args.exp / "per_run" / run_name(*key)
        if is_done(args.exp, key):
            continue
        if not ready(args.exp, key):
            print(f"[forking_horizon] skip {run_name(*key)}: its clip_b run is not done", flush=True)
            continue
        if not claim(d):
            continue
        t0 = time.perf_counter()
        train_one(key, args.steps, args.eval_every, args.exp, args.experiment)
        (d / "claim").unlink(missing_ok=True)
        print(f"[forking_horizon] {run_name(*key)} done in {time.perf_counter() - t0:.0f}s", flush=True)


def pool(args: argparse.Namespace, keys: list[Key]) -> None:
    """Run the missing runs in ``args.workers`` single-thread subprocesses, in :func:`planned` order (a replay run
    waits for its Clip_B run). No run starts after ``args.deadline`` seconds."""
    t0, running = time.perf_counter(), {}
    todo = [k for k in keys if not is_done(args.exp, k)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    while todo or running:
        for key, proc in list(running.items()):
            if proc.poll() is not None:
                del running[key]
                print(f"[pool] {run_name(*key)} exit {proc.returncode} at {time.perf_counter() - t0:.0f}s", flush=True)
        elapsed = time.perf_counter() - t0
        startable = [k for k in todo if ready(args.exp, k)]
        while startable and len(running) < args.workers and elapsed < args.deadline:
            key = startable.pop(0)
            todo.remove(key)
            base, arm, seed = key
            cmd = [
                sys.executable,
                "-m",
                "scripts.studies.horizon",
                "--run",
                "--experiment",
                args.experiment,
                "--exp",
                str(args.exp),
            ]
            cmd += ["--bases", base, "--arms", arm]
            cmd += ["--seeds", str(seed), "--steps", str(args.steps), "--eval-every", str(args.eval_every)]
            log = args.exp / "logs" / f"{run_name(*key)}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            running[key] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
            print(f"[pool] started {run_name(*key)} at {elapsed:.0f}s", flush=True)
        if not running and (not startable or elapsed >= args.deadline):
            return
        time.sleep(2)


def _names(text: str, allowed: tuple[str, ...] | dict[str, str], flag: str) -> tuple[str, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ValueError(f"{flag} has unknown names {unknown}; choose from {sorted(allowed)}")
    return names


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", choices=tuple(EXPERIMENTS), default="horizon")
    p.add_argument("--exp", type=Path, default=None, help="results directory (default: the experiment's)")
    p.add_argument("--bases", default=",".join(BASES))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--steps", type=int, default=None, help="default: the experiment's (400 / 300)")
    p.add_argument("--eval-every", type=int, default=None, help="default: the experiment's (40 / 30)")
    p.add_argument("--status", action="store_true")
    p.add_argument("--run", action="store_true")
    p.add_argument("--analyze", action="store_true")
    p.add_argument("--update-readme", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--workers", type=int, default=0, help="with --run: this many subprocesses (0: in-process)")
    p.add_argument("--deadline", type=float, default=1e9, help="with --workers: start no run after this (s)")
    args = p.parse_args(argv)
    spec = EXPERIMENTS[args.experiment]
    args.exp = args.exp or spec["exp"]
    args.steps = args.steps or spec["steps"]
    args.eval_every = args.eval_every or spec["eval_every"]
    bases = _names(args.bases, BASES, "--bases")
    arms = _names(args.arms, ARMS, "--arms")
    keys = planned(bases, arms, tuple(int(s) for s in args.seeds.split(",")))
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", message=".*(does not have many workers|LightningCLI|TensorBoard).*")
    if args.status:
        status(args.exp, keys)
    if args.run:
        (pool if args.workers else execute)(args, keys)
    if args.analyze or args.update_readme:
        from scripts.studies.horizon.analysis import analyze

        analyze(args.exp, update_readme=args.update_readme, experiment=args.experiment)


if __name__ == "__main__":
    main()

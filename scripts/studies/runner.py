"""The study runner: one loop that runs, resumes and lists the runs of any pre-registered study design.

A study (``scripts/studies/<name>/run.py``) describes its runs as keys (``(base, arm, seed)``) and hands a
:class:`Study` to :func:`execute` (in this process, in order), :func:`pool` (single-thread subprocesses) or
:func:`status`. A run is claimed by its process (:func:`claim`), so several workers can share one study; a finished
run (``done.json``, or a row in the experiment's table) is skipped, so a study resumes from what is there. Every run
records :func:`code_revision`: the last commit that touched the study's code paths.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from scripts.studies.results import done_records, is_finished

__all__ = ["Study", "add_arguments", "arm_study", "claim", "code_revision", "execute", "pool", "prepare", "status"]

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Study:
    """How the runner reaches one experiment's runs.

    Attributes:
        tag: prefix of the runner's log lines (``forking_sod``).
        exp: the experiment's results directory (``per_run/<run>/``, ``logs/``).
        name: a key's run name (its directory under ``per_run/``).
        done: whether a key's run has finished.
        ready: whether a key's run may start now (a replay run needs its Clip_B run).
        train: trains one key's run in this process and writes its results.
        command: the arguments of ``python -m ...`` that run one key's run alone (for :func:`pool`).
    """

    tag: str
    exp: Path
    name: Callable[[Hashable], str]
    done: Callable[[Hashable], bool]
    ready: Callable[[Hashable], bool]
    train: Callable[[Hashable], None]
    command: Callable[[Hashable], list[str]]


def arm_study(
    tag: str, module: str, args: argparse.Namespace, name: Callable[[Any], str], train: Callable[[Any], None]
) -> Study:
    """The runner's view of an experiment's ``(base, arm, seed)`` runs (base None in a one-base experiment).

    A run is done once it is in ``args.exp``'s table or ``per_run/`` (:func:`scripts.studies.results.is_finished`);
    a ``replay*`` arm is ready once the Clip_B run of its base and seed is done (it replays that run's counts); one
    run alone is ``python -m <module> --run --experiment ... --arms <arm> --seeds <seed> [--bases <base>]`` with
    ``args``' steps and evaluation interval.
    """

    def done(key: Any) -> bool:
        return is_finished(args.exp, name(key))

    def ready(key: Any) -> bool:
        base, arm, seed = key
        return not arm.startswith("replay") or done((base, "clip_b", seed))

    def command(key: Any) -> list[str]:
        base, arm, seed = key
        return [
            module,
            *("--run", "--experiment", args.experiment, "--exp", str(args.exp), "--arms", arm, "--seeds", str(seed)),
            *("--steps", str(args.steps), "--eval-every", str(args.eval_every)),
            *(["--bases", base] if base is not None else []),
        ]

    return Study(tag=tag, exp=args.exp, name=name, done=done, ready=ready, train=train, command=command)


def code_revision(code_paths: Sequence[str]) -> str:
    """Last commit that touched ``code_paths``, with ``+dirty`` when they have uncommitted changes
    (``FORKING_CODE_REV`` where the copy has no git history, e.g. on another machine)."""
    if os.environ.get("FORKING_CODE_REV"):
        return os.environ["FORKING_CODE_REV"]

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()

    rev = git("log", "-1", "--format=%h", "--", *code_paths) or "unknown"
    return rev + ("+dirty" if git("status", "--porcelain", "--", *code_paths) else "")


def claim(run_dir: Path) -> bool:
    """Claim a run for this process (``claim`` holds the PID; a dead owner's claim is taken over)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "claim"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(path.read_text() or "0"), 0)
            return False
        except (ProcessLookupError, ValueError):
            path.unlink(missing_ok=True)
            return claim(run_dir)
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def status(study: Study, keys: Sequence[Hashable]) -> None:
    """One line per run: done (wall seconds, code revision, torch; from ``per_run/`` or the experiment's table),
    claimed or todo."""
    table = done_records(study.exp)
    for key in keys:
        d = study.exp / "per_run" / study.name(key)
        done = (d / "done.json").exists()
        info = json.loads((d / "done.json").read_text()) if done else table.get(study.name(key))
        if info is not None:
            state = f"done  {info['seconds']:7.0f}s  code {info['code_revision']}  torch {info['torch']}"
        else:
            state = "claimed (running?)" if (d / "claim").exists() else "todo"
        print(f"{study.name(key):28s} {state}")


def execute(study: Study, keys: Sequence[Hashable]) -> None:
    """Run the missing runs of ``keys`` in this process, in order."""
    for key in keys:
        d = study.exp / "per_run" / study.name(key)
        if study.done(key):
            continue
        if not study.ready(key):
            print(f"[{study.tag}] skip {study.name(key)}: its clip_b run is not done", flush=True)
            continue
        if not claim(d):
            continue
        t0 = time.perf_counter()
        study.train(key)
        (d / "claim").unlink(missing_ok=True)
        print(f"[{study.tag}] {study.name(key)} done in {time.perf_counter() - t0:.0f}s", flush=True)


def pool(study: Study, keys: Sequence[Hashable], workers: int, deadline: float = 1e9, grace: float = 0.0) -> None:
    """Run the missing runs of ``keys`` in ``workers`` single-thread subprocesses, in order; a run starts once it is
    ready. No run starts after ``deadline`` seconds; runs still going at ``deadline + grace`` are killed (their
    claims are cleared, so :func:`status` lists them as todo)."""
    t0, running = time.perf_counter(), {}
    todo = [key for key in keys if not study.done(key)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    while todo or running:
        for key, proc in list(running.items()):
            if proc.poll() is not None:
                del running[key]
                print(f"[pool] {study.name(key)} exit {proc.returncode} at {time.perf_counter() - t0:.0f}s", flush=True)
        elapsed = time.perf_counter() - t0
        if elapsed > deadline + grace:
            for key, proc in running.items():
                proc.kill()
                (study.exp / "per_run" / study.name(key) / "claim").unlink(missing_ok=True)
                print(f"[pool] killed {study.name(key)} at the deadline", flush=True)
            return
        startable = [key for key in todo if study.ready(key)]
        while startable and len(running) < workers and elapsed < deadline:
            key = startable.pop(0)
            todo.remove(key)
            log = study.exp / "logs" / f"{study.name(key)}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "-m", *study.command(key)]
            running[key] = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
            print(f"[pool] started {study.name(key)} at {elapsed:.0f}s", flush=True)
        if not running and (not startable or elapsed >= deadline):
            return
        time.sleep(2)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every study's command line shares: what to do, and how many threads and workers."""
    parser.add_argument("--exp", type=Path, default=None, help="results directory (default: the experiment's)")
    parser.add_argument("--status", action="store_true")
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--analyze", action="store_true")
    parser.add_argument("--update-readme", action="store_true")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--workers", type=int, default=0, help="with --run: this many subprocesses (0: in-process)")
    parser.add_argument("--deadline", type=float, default=1e9, help="with --workers: start no run after this (s)")
    parser.add_argument("--grace", type=float, default=0.0, help="with --workers: kill runs at deadline + grace (s)")


def prepare(args: argparse.Namespace) -> None:
    """Threads and quiet logs for the runs of this process."""
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore", message=".*(does not have many workers|LightningCLI|TensorBoard).*")


def run(study: Study, keys: Sequence[Hashable], args: argparse.Namespace) -> None:
    """``--status`` and ``--run`` of :func:`add_arguments`'s command line."""
    if args.status:
        status(study, keys)
    if args.run:
        if args.workers:
            pool(study, keys, args.workers, args.deadline, args.grace)
        else:
            execute(study, keys)

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
from pathlib import Path
from typing import Any

from scripts.studies import runner
from scripts.studies.controls import ReplayedCountMasking, RoleRecorder, read_counts
from scripts.studies.forking.run import correct_logprob
from scripts.studies.results import run_rows
from scripts.studies.runs import fit_and_record

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
    "scripts/studies/runner.py",
    "scripts/studies/tasks",
)

Key = tuple[str, str, int]  # (base, arm, seed)


def run_name(base: str, arm: str, seed: int) -> str:
    return f"{base}__{arm}__s{seed}"


def code_revision() -> str:
    """Last commit that touched :data:`CODE_PATHS` (:func:`scripts.studies.runner.code_revision`)."""
    return runner.code_revision(CODE_PATHS)


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


def study(args: argparse.Namespace) -> runner.Study:
    """The runner's view of ``args.experiment``'s runs (a key is ``(base, arm, seed)``)."""
    return runner.arm_study(
        "forking_horizon",
        "scripts.studies.horizon",
        args,
        name=lambda key: run_name(*key),
        train=lambda key: train_one(key, args.steps, args.eval_every, args.exp, args.experiment),
    )


def _names(text: str, allowed: tuple[str, ...] | dict[str, str], flag: str) -> tuple[str, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = sorted(set(names) - set(allowed))
    if unknown:
        raise ValueError(f"{flag} has unknown names {unknown}; choose from {sorted(allowed)}")
    return names


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", choices=tuple(EXPERIMENTS), default="horizon")
    runner.add_arguments(p)
    p.add_argument("--bases", default=",".join(BASES))
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    p.add_argument("--steps", type=int, default=None, help="default: the experiment's (400 / 300)")
    p.add_argument("--eval-every", type=int, default=None, help="default: the experiment's (40 / 30)")
    args = p.parse_args(argv)
    spec = EXPERIMENTS[args.experiment]
    args.exp = args.exp or spec["exp"]
    args.steps = args.steps or spec["steps"]
    args.eval_every = args.eval_every or spec["eval_every"]
    bases = _names(args.bases, BASES, "--bases")
    arms = _names(args.arms, ARMS, "--arms")
    keys = planned(bases, arms, tuple(int(s) for s in args.seeds.split(",")))
    runner.prepare(args)
    runner.run(study(args), keys, args)
    if args.analyze or args.update_readme:
        from scripts.studies.horizon.analysis import analyze

        analyze(args.exp, update_readme=args.update_readme, experiment=args.experiment)


if __name__ == "__main__":
    main()

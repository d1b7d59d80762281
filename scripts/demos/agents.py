"""The agent demonstrations of docs/agents_demos.md: learning runs, their independent evaluation, the figures.

    nice -n 19 python -m scripts.demos.agents run --task calculator --arms grpo clip_b clip_v --seeds 0 1 2
    nice -n 19 python -m scripts.demos.agents run --task guessing --arms grpo --seeds 0 1 2
    nice -n 19 python -m scripts.demos.agents evaluate     # start (base model) and end (hf_model) of every run
    nice -n 19 python -m scripts.demos.agents evaluate --runs DIR --keep-other-tasks   # one task rerun alone
    python -m scripts.demos.agents figures                 # docs/figures/agents_*.png and the table of the page

``run`` starts each run as a user would (``python -m lit_entropy fit --config configs/<task config>``, one run at a
time, ``--trainer.max_steps``) and keeps its wall time, CPU seconds, the load average when it started and the
commit in ``<runs>/<task>_<arm>/seed<k>/demo_run.json``. ``evaluate`` measures the base model and each run's final
policy (``hf_model/``) on held-out problems with the plain sampler of :mod:`scripts.assets.agent_rollout`, not the
library's rollout loop, and reads the runs' TensorBoard curves; both go to ``docs/figures/agents_demos.parquet``
(one row per run, stage and metric) and ``docs/figures/agents_demos_curves.parquet``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
FIGURES = REPO / "docs" / "figures"
RESULTS = FIGURES / "agents_demos.parquet"
CURVES = FIGURES / "agents_demos_curves.parquet"
#: Config of each (task, arm).
CONFIGS = {
    ("calculator", "grpo"): "configs/calculator_tools.yaml",
    ("calculator", "clip_b"): "configs/calculator_tools_clip_b.yaml",
    ("calculator", "clip_v"): "configs/calculator_tools_clip_v.yaml",
    ("guessing", "grpo"): "configs/guessing_game.yaml",
}
BASE_MODELS = {
    "calculator": "lit_entropy/assets/tiny-qwen2-calculator",
    "guessing": "lit_entropy/assets/tiny-qwen2-guess",
}
#: TensorBoard tags kept as curves (those a run does not log are skipped).
CURVE_TAGS = (
    "train/reward/mean",
    "train/multi_turn/tool_calls",
    "train/multi_turn/turns",
    "train/entropy/mean",
    "val/avg@4",
)


def git_commit() -> str:
    """The checkout's commit (``-dirty`` when tracked files differ from it)."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "lit_entropy", "configs"], cwd=REPO).returncode
    return sha.strip() + ("-dirty" if dirty else "")


def run_one(task: str, arm: str, seed: int, steps: int, runs: Path, extra: list[str]) -> dict[str, Any]:
    """One learning run in a subprocess; its record (command, wall / CPU seconds, load, commit)."""
    out = runs / f"{task}_{arm}" / f"seed{seed}"
    command = [
        sys.executable, "-m", "lit_entropy", "fit", "--config", CONFIGS[task, arm], f"--seed_everything={seed}",
        f"--trainer.max_steps={steps}", f"--trainer.logger.init_args.save_dir={runs}",
        f"--trainer.logger.init_args.name={task}_{arm}", f"--trainer.logger.init_args.version=seed{seed}", *extra,
    ]  # fmt: skip
    load = os.getloadavg()
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run(command, cwd=REPO, check=True)
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    record = {
        "task": task, "arm": arm, "seed": seed, "steps": steps, "command": " ".join(command[1:]),
        "wall_s": round(time.perf_counter() - t0, 1),
        "cpu_s": round(cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime, 1),
        "load_at_start": [round(x, 2) for x in load], "commit": git_commit(),
    }  # fmt: skip
    (out / "demo_run.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record), flush=True)
    return record


def evaluate_model(task: str, path: str, seed: int, prompts: int) -> dict[str, float]:
    """The task's figures for the model at ``path`` (T = 1 samples, held-out problems, the plain sampler)."""
    # deferred: torch / transformers only for evaluation, not for `run` (whose subprocesses import them)
    import torch  # noqa: PLC0415 - reason: see above
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415 - reason: see above

    from lit_entropy.environments.calculator import make_calculator_examples  # noqa: PLC0415 - reason: see above
    from lit_entropy.environments.guessing_game import make_guessing_examples  # noqa: PLC0415 - reason: see above
    from scripts.assets import make_calculator_model, make_guessing_model  # noqa: PLC0415 - reason: see above

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if task == "calculator":
        rows = make_calculator_examples("test", prompts, seed=0)
        return make_calculator_model.evaluate(model, tokenizer, rows, samples=4, seed=seed)
    rows = make_guessing_examples("test", prompts)
    return make_guessing_model.evaluate(model, tokenizer, rows, seed=seed)


def evaluate(runs: Path, prompts: int, keep_other_tasks: bool = False) -> None:
    """Start / end figures of every run under ``runs`` and their curves, into the two parquet files; with
    ``keep_other_tasks`` the files' rows of tasks that have no run under ``runs`` stay (one task rerun alone)."""
    # deferred: pandas only here
    import pandas as pd  # noqa: PLC0415 - reason: see above

    from scripts.docs.run_summary import read_scalars  # noqa: PLC0415 - reason: see above

    rows, curves = [], []
    for record_path in sorted(runs.glob("*/seed*/demo_run.json")):
        record = json.loads(record_path.read_text())
        task, arm, seed = record["task"], record["arm"], record["seed"]
        stages = {"start": BASE_MODELS[task], "end": str(record_path.parent / "hf_model")}
        for stage, path in stages.items():
            figures = evaluate_model(task, path, seed=1000 + seed, prompts=prompts)
            print(task, arm, seed, stage, {k: round(v, 3) for k, v in figures.items()}, flush=True)
            for metric, value in figures.items():
                rows.append({**_meta(record), "stage": stage, "metric": metric, "value": value, "prompts": prompts})
        scalars = read_scalars(record_path.parent)
        for tag in CURVE_TAGS:
            for step, value in scalars.get(tag, []):
                curves.append({"task": task, "arm": arm, "seed": seed, "tag": tag, "step": step, "value": value})
    if not rows:
        raise SystemExit(f"no runs under {runs} (each run writes */seed*/demo_run.json)")
    FIGURES.mkdir(parents=True, exist_ok=True)
    tables = {RESULTS: pd.DataFrame(rows), CURVES: pd.DataFrame(curves)}
    for path, table in tables.items():
        if keep_other_tasks and path.exists():
            old = pd.read_parquet(path)
            table = pd.concat([old[~old.task.isin(set(tables[RESULTS].task))], table], ignore_index=True)
        table.to_parquet(path, index=False)
    print(f"wrote {RESULTS.relative_to(REPO)} ({len(rows)} rows), {CURVES.relative_to(REPO)} ({len(curves)} rows)")


def _meta(record: dict[str, Any]) -> dict[str, Any]:
    keep = ("task", "arm", "seed", "steps", "wall_s", "cpu_s", "commit")
    return {**{k: record[k] for k in keep}, "load_at_start": record["load_at_start"][0]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="learning runs, one at a time")
    run.add_argument("--task", choices=("calculator", "guessing"), required=True)
    run.add_argument("--arms", nargs="+", default=["grpo"], choices=("grpo", "clip_b", "clip_v"))
    run.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    run.add_argument("--steps", type=int, default=60)
    run.add_argument("--runs", type=Path, default=REPO / "runs" / "agents_demos")
    run.add_argument("extra", nargs="*", help="further settings after --, e.g. -- --model.optim.lr=5e-4")
    ev = sub.add_parser("evaluate", help="start / end figures and curves of every run, into docs/figures/*.parquet")
    ev.add_argument("--runs", type=Path, default=REPO / "runs" / "agents_demos")
    ev.add_argument("--prompts", type=int, default=128, help="held-out problems (games) per evaluation")
    ev.add_argument("--keep-other-tasks", action="store_true", help="keep the files' rows of tasks not under --runs")
    sub.add_parser("figures", help="docs/figures/agents_*.png and the page's table from the parquet files")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.command == "run":
        for arm in args.arms:
            if (args.task, arm) not in CONFIGS:
                raise SystemExit(f"--arms: no {arm} config for the {args.task} task")
            for seed in args.seeds:
                run_one(args.task, arm, seed, args.steps, args.runs, args.extra)
    elif args.command == "evaluate":
        evaluate(args.runs, args.prompts, args.keep_other_tasks)
    else:
        # deferred: matplotlib only for the figures
        from scripts.demos.agents_figures import write_figures  # noqa: PLC0415 - reason: see above

        write_figures(RESULTS, CURVES, FIGURES)


if __name__ == "__main__":
    main()

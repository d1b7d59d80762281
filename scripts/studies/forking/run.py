"""Methods x RL seeds x base models on the forking-decision testbed (``scripts.studies.tasks.forking``).

Does GRPO's entropy collapse cost coverage (pass@K at large K) where a minority strategy is sometimes
right, and does Clip_B (arXiv 2602.03392, mu = 2.5) prevent it better than controls that remove the same
number of negative gradients at random, add an entropy bonus, or raise the upper ratio clip?

Each run trains one method (``configs/forking/base.yaml`` + ``configs/forking/<method>.yaml``) from one base
model (``scripts/forking/models/``, built by ``scripts/studies/forking/make_models.py``) with one RL seed and evaluates
the policy on the stratified **test** split (16 prompts per class) every ``EVAL_EVERY`` steps at T = 1.0 and 0.7.
Every prompt has exactly one correct response, so the evaluation scores it by teacher forcing: with p its
probability under sampling at temperature T, one sample is correct with probability p, avg@K has expectation p
and pass@k = 1 - (1 - p)^k exactly, for any k (1..64, and 256 for the rare classes): the quantities the usual
K-sample estimators estimate, without their sampling noise, at the cost of one forward pass. Each run writes
``<out>/runs/<run>/{eval,train}.csv`` and a ``done`` marker; finished runs (in ``runs/`` or already in the
collected tables) are skipped, so the study resumes where it stopped. ``--collect`` merges the runs into the two
tidy tables ``<out>/eval.csv`` (one row per run, step, temperature and prompt: log-probability of the correct
response and of its first token) and ``<out>/train.csv`` (one row per run and training step: entropy and masked
share of the strategy token and of the rest, reward); ``--analyze`` reads only those two tables and writes
``summary.json``, ``summary.md``, ``metrics_by_run.csv``, ``readme_table.md`` and the plots. (Issue 24: this
study's 80-step design could not show the paper's gain and its bootstrap intervals were too narrow. Its tables stay
in ``scripts/forking/results/`` as they were; the documentation carries the pre-registered horizon study,
``scripts/studies/horizon/run.py``, instead.)

    python -m scripts.studies.forking --grid priority --out scripts/forking/results   # GRPO, Clip_B, random mask
    python -m scripts.studies.forking --grid full --out scripts/forking/results       # all methods + neutral task
    python -m scripts.studies.forking --collect --analyze --out scripts/forking/results
    python -m scripts.studies.forking --smoke --out /tmp/forking_smoke                # pipeline check, < 1 min

PRIMARY ENDPOINT (fixed before any run): on the test split at T = 1.0, pass@64 and avg@64 over the task's
class distribution (classes weighted 70/20/8/2 %, ``CLASS_PROBS``), (i) at the last step and (ii) averaged
over the evaluations after step 0; reported as the paired per-seed difference against GRPO (same base
model, same RL seed), with a 95 % bootstrap interval that resamples seeds and, within each class, prompts.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[3]
STUDY_DIR = ROOT / "scripts" / "forking"
CONFIG_DIR = ROOT / "configs" / "forking"
# Base models (scripts/studies/forking/make_models.py); FORKING_MODELS points elsewhere, e.g. at freshly rebuilt ones.
MODELS_DIR = Path(os.environ.get("FORKING_MODELS", STUDY_DIR / "models"))

# ------------------------------------------------------------------------------------ fixed design
# The design lives in forking_design.py (forking_analysis.py reads it too); re-exported for callers of this script.
from scripts.studies.forking.design import (  # noqa: E402, F401  (re-exported: the design as this script's attributes)
    BOOTSTRAP,
    EVAL_EVERY,
    FORK_BASES,
    KS,
    METHODS,
    NEUTRAL_BASE,
    NEUTRAL_METHODS,
    PRIMARY_K,
    PRIMARY_T,
    PRIORITY_METHODS,
    SEEDS,
    STEPS,
    TEMPERATURES,
    Run,
    grid,
)
from scripts.studies.runs import write_csv  # noqa: E402  (below the constants, with the design import)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="study directory (runs/, eval.csv, train.csv, plots)")
    p.add_argument("--grid", choices=("priority", "full", "none"), default="priority")
    p.add_argument("--methods", default=None, help="comma-separated subset of the grid's methods")
    p.add_argument("--bases", default=None, help="comma-separated subset of base models")
    p.add_argument("--seeds", default=None, help="comma-separated RL seeds (default 0..4)")
    p.add_argument("--shard", default="0/1", help="i/n: run every n-th run of the grid starting at i")
    p.add_argument("--smoke", action="store_true", help="tiny grid, 2 steps, few samples (pipeline test)")
    p.add_argument("--collect", action="store_true", help="concatenate runs/ into eval.csv and train.csv")
    p.add_argument("--analyze", action="store_true", help="summary and plots from eval.csv and train.csv")
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


# ------------------------------------------------------------------- the one place that names config keys
def cli_args(run: Run, run_dir: Path, smoke: bool) -> list[str]:
    """LightningCLI arguments of one run: the configs plus the per-run overrides (every key the study sets)."""
    data = STUDY_DIR / "data" / run.task
    args = [
        "--config",
        str(CONFIG_DIR / "base.yaml"),
        "--config",
        str(CONFIG_DIR / METHODS[run.method]),
    ]
    if run.task == "chain":
        args += ["--config", str(CONFIG_DIR / "neutral.yaml")]
    args += [
        f"--seed_everything={run.seed}",
        f"--trainer.max_steps={run.steps}",
        f"--model.policy.model_name_or_path={MODELS_DIR / run.base}",
        f"--data.train_dataset={data / 'train.jsonl'}",
        f"--data.seed={run.seed}",
        f"--trainer.default_root_dir={run_dir}",  # where LightningCLI saves the resolved config.yaml
        "--val_before_train=false",
    ]
    if smoke:
        args += ["--data.batch_size=4", "--model.sampling.num_samples=4"]
    return args


# ------------------------------------------------------------------------------------- evaluation
def load_rows(task: str, split: str) -> list[dict[str, str]]:
    path = STUDY_DIR / "data" / task / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@torch.no_grad()
def correct_logprob(
    policy: Any, tokenizer: Any, rows: list[dict[str, str]], temperature: float
) -> tuple[list[float], list[float]]:
    """Log-probability, under sampling at ``temperature``, of each prompt's unique correct response (then ``<eos>``),
    and of its first token (the strategy choice). Teacher forcing, one forward pass; float64 sums.

    Every task here has exactly one correct response, so with p = exp(logp) a sample is correct with probability
    p: avg@K has expectation p and pass@k equals 1 - (1 - p)^k exactly, for any k. This replaces the Monte-Carlo
    estimate from K samples (same expectation, no sampling noise, ~1000x cheaper).
    """
    was_training = policy.training
    policy.eval()
    eos = tokenizer.eos_token_id
    seqs, starts = [], []
    for r in rows:
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        a = tokenizer(r["answer"], add_special_tokens=False)["input_ids"] + [eos]
        seqs.append(p + a)
        starts.append(len(p))
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, seq in enumerate(seqs):  # right padding: positions start at 0 for every row
        ids[i, : len(seq)] = torch.tensor(seq)
        att[i, : len(seq)] = 1
    logits = policy(input_ids=ids, attention_mask=att, use_cache=False).logits.double() / temperature
    logp_all = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    total, first = [], []
    for i, (seq, start) in enumerate(zip(seqs, starts, strict=True)):
        # logits at position t predict token t + 1: the response tokens are start .. len(seq) - 1
        lp = logp_all[i, start - 1 : len(seq) - 1]
        total.append(float(lp.sum()))
        first.append(float(lp[0]))
    policy.train(was_training)
    return total, first


def evaluate(policy: Any, tokenizer: Any, run: Run, step: int, smoke: bool) -> list[dict[str, Any]]:
    """Tidy rows (one per prompt and temperature) of one evaluation on the test split."""
    rows = load_rows(run.task, "test")
    if smoke:
        rows = rows[:: max(1, len(rows) // 8)][:8]
    out = []
    for temp in TEMPERATURES:
        logp, logp_first = correct_logprob(policy, tokenizer, rows, temp)
        for r, lp, lf in zip(rows, logp, logp_first, strict=True):
            out.append(
                {
                    **_run_cols(run),
                    "step": step,
                    "temperature": temp,
                    "prompt": r["prompt"],
                    "class": r["class"],
                    "logp": f"{lp:.6g}",
                    "logp_first": f"{lf:.6g}",
                }
            )
    return out


def _run_cols(run: Run) -> dict[str, Any]:
    return {"task": run.task, "base": run.base, "method": run.method, "seed": run.seed}


# --------------------------------------------------------------------------------------- training
def make_recorder(run: Run, eval_steps: set[int], smoke: bool):
    """A callback that records per-step token statistics by role and evaluates at ``eval_steps``."""
    from lightning.pytorch import Callback

    class StudyRecorder(Callback):
        """Observer (lit_entropy.protocol): entropy and masked share, strategy token (response position 0) vs rest."""

        required_fields = frozenset({"mask", "advantages", "entropy"})

        def __init__(self) -> None:
            self.train_rows: list[dict[str, Any]] = []
            self.eval_rows: list[dict[str, Any]] = []
            self._pending: dict[str, Any] = {}

        def observe_keep_mask(self, trainer: Any, pl_module: Any, context: Any, keep: torch.Tensor) -> None:
            mask, adv, ent = context.mask, context.advantages, context.entropy.float()
            role = torch.zeros_like(mask)
            role[:, 0] = True  # the strategy token: first response position
            row: dict[str, Any] = {}
            for name, sel in (("strategy", mask & role), ("rest", mask & ~role)):
                n = sel.sum().clamp(min=1)
                neg = sel & (adv < 0)
                row[f"entropy_{name}"] = float(ent[sel].sum() / n)
                row[f"masked_{name}"] = float((sel & ~keep).sum() / n)
                row[f"masked_neg_{name}"] = float((neg & ~keep).sum() / neg.sum().clamp(min=1))
                row[f"tokens_{name}"] = int(sel.sum())
            row["masked_all"] = float((mask & ~keep).sum() / mask.sum().clamp(min=1))
            self._pending = row

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            step = int(trainer.global_step)
            reward = trainer.callback_metrics.get("train/reward/mean")
            self.train_rows.append(
                {
                    **_run_cols(run),
                    "step": step,
                    "reward_mean": float(reward) if reward is not None else math.nan,
                    **self._pending,
                }
            )
            if step in eval_steps:
                self.eval_rows += evaluate(pl_module.policy, pl_module.tokenizer, run, step, smoke)

    return StudyRecorder()


def train_one(run: Run, run_dir: Path, smoke: bool) -> None:
    from lit_entropy.cli import cli_main

    eval_every = 1 if smoke else EVAL_EVERY
    eval_steps = set(range(eval_every, run.steps + 1, eval_every)) | {run.steps}
    cli = cli_main(args=cli_args(run, run_dir, smoke), run=False)
    recorder = make_recorder(run, eval_steps, smoke)
    cli.trainer.callbacks.append(recorder)
    t0 = time.perf_counter()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    seconds = time.perf_counter() - t0
    run_dir.mkdir(parents=True, exist_ok=True)
    write_csv(run_dir / "eval.csv", recorder.eval_rows)
    write_csv(run_dir / "train.csv", recorder.train_rows)
    (run_dir / "done").write_text(json.dumps({"seconds": round(seconds, 1), "steps": run.steps}) + "\n")


def evaluate_base(task: str, base: str, run_dir: Path, smoke: bool) -> None:
    """Step-0 evaluation of a base model (shared by every method and seed)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = MODELS_DIR / base
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    run = Run(task, base, "base", -1, 0)
    t0 = time.perf_counter()
    rows = evaluate(policy, tokenizer, run, 0, smoke=smoke)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_csv(run_dir / "eval.csv", rows)
    (run_dir / "done").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1), "steps": 0}) + "\n")


def _run_key(row: dict[str, Any]) -> str:
    return f"{row['task']}__{row['base']}__{row['method']}__s{row['seed']}"


def tabled_runs(out: Path) -> set[str]:
    """Runs already in the collected ``eval.parquet`` (a fresh checkout has the tables but no ``runs/``)."""
    path = out / "eval.parquet"
    if not path.exists():
        return set()
    keys = pd.read_parquet(path, columns=["task", "base", "method", "seed"]).drop_duplicates()
    return {_run_key(row) for row in keys.to_dict("records")}


def claim(run_dir: Path) -> bool:
    """Claim a run for this process, so several workers (``--shard`` or plain copies) can share one study:
    ``run_dir/claim`` holds the owner's PID; a claim whose process is gone (an interrupted worker) is taken over."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "claim"
    for _ in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            text = path.read_text()
            if not text:
                return False  # another worker is writing its PID right now
            try:
                os.kill(int(text), 0)  # raises if no such process
                return int(text) == os.getpid()
            except ProcessLookupError:
                path.unlink(missing_ok=True)  # stale: its worker died
                continue
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return True
    return False


def execute(args: argparse.Namespace) -> None:
    runs = grid(args)
    index, count = (int(x) for x in args.shard.split("/"))
    done = tabled_runs(args.out)
    bases = sorted({(r.task, r.base) for r in runs})
    for task, base in bases:
        run_dir = args.out / "runs" / f"{task}__{base}__base__s-1"
        if not (run_dir / "done").exists() and run_dir.name not in done:
            evaluate_base(task, base, run_dir, args.smoke)
    for i, run in enumerate(runs):
        if i % count != index:
            continue
        run_dir = args.out / "runs" / run.name
        if (run_dir / "done").exists() or run.name in done or not claim(run_dir):
            continue
        t0 = time.perf_counter()
        train_one(run, run_dir, args.smoke)
        print(f"[forking_study] {run.name} done in {time.perf_counter() - t0:.0f}s", flush=True)


def collect(out: Path) -> None:
    """Merge every finished run under ``runs/`` (its ``eval.csv`` / ``train.csv``) into the study's ``eval.parquet``
    and ``train.parquet`` (rows of runs that are only in the existing tables are kept), sorted by run so the tables
    are stable."""
    finished = sorted(d for d in (out / "runs").glob("*") if (d / "done").exists())
    fresh = {d.name for d in finished}
    for table in ("eval", "train"):
        runs: dict[str, pd.DataFrame] = {}
        if (out / f"{table}.parquet").exists():
            kept = pd.read_parquet(out / f"{table}.parquet")
            keys = kept["task"] + "__" + kept["base"] + "__" + kept["method"] + "__s" + kept["seed"].astype(str)
            for key, rows in kept.groupby(keys, sort=False):
                if key not in fresh:
                    runs[str(key)] = rows
        for run_dir in finished:
            if (run_dir / f"{table}.csv").exists():
                runs[run_dir.name] = pd.read_csv(run_dir / f"{table}.csv")
        if runs:
            merged = pd.concat([runs[key] for key in sorted(runs)], ignore_index=True)
            tmp = out / f"{table}.parquet.tmp"
            merged.to_parquet(tmp, index=False)
            tmp.replace(out / f"{table}.parquet")
    seconds_path = out / "run_seconds.json"
    seconds = json.loads(seconds_path.read_text()) if seconds_path.exists() else {}
    for run_dir in finished:
        seconds[run_dir.name] = json.loads((run_dir / "done").read_text())["seconds"]
    seconds_path.write_text(json.dumps(seconds, indent=1, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import warnings

    warnings.filterwarnings("ignore", message=".*(does not have many workers|LightningCLI|TensorBoard).*")
    if not (args.collect or args.analyze) or args.smoke:
        execute(args)
    if args.collect or args.smoke:
        collect(args.out)
    if args.analyze or args.smoke:
        from scripts.studies.forking.analysis import analyze

        analyze(args.out)


if __name__ == "__main__":
    main()

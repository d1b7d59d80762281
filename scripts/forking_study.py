"""Methods x RL seeds x base models on the forking-decision testbed (``lit_entropy.data.forking``).

Does GRPO's entropy collapse cost coverage (pass@K at large K) where a minority strategy is sometimes
right, and does Clip_B (arXiv 2602.03392, mu = 2.5) prevent it better than controls that remove the same
number of negative gradients at random, add an entropy bonus, or raise the upper ratio clip?

Each run trains one method (``configs/forking/base.yaml`` + ``configs/forking/<method>.yaml``) from one base
model (``scripts/forking/models/``, built by ``scripts/make_forking_models.py``) with one RL seed, evaluates
on the stratified **test** split (per class; samples drawn with a fixed seed, so methods share the noise),
and writes ``<out>/runs/<run>/{eval,train}.csv`` and a ``done`` marker: finished runs are skipped, so the
study resumes where it stopped. ``--collect`` concatenates the runs into the two tidy tables
``<out>/eval.csv`` (one row per run, evaluation step, temperature and prompt: samples ``n``, correct ``c``)
and ``<out>/train.csv`` (one row per run and training step); ``--analyze`` reads only those two tables and
writes ``summary.json``, ``summary.md`` and the plots.

    python scripts/forking_study.py --grid priority --out scripts/forking/results   # GRPO, Clip_B, random mask
    python scripts/forking_study.py --grid full --out scripts/forking/results       # all methods + neutral task
    python scripts/forking_study.py --collect --analyze --out scripts/forking/results
    python scripts/forking_study.py --smoke --out /tmp/forking_smoke                # pipeline check, < 1 min

PRIMARY ENDPOINT (fixed before any run): on the test split at T = 1.0, pass@64 and avg@64 over the task's
class distribution (classes weighted 70/20/8/2 %, ``CLASS_PROBS``), (i) at the last step and (ii) averaged
over the evaluations after step 0; reported as the paired per-seed difference against GRPO (same base
model, same RL seed), with a 95 % bootstrap interval that resamples seeds and, within each class, prompts.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
STUDY_DIR = Path(__file__).resolve().parent / "forking"
CONFIG_DIR = ROOT / "configs" / "forking"
# Base models (scripts/make_forking_models.py); FORKING_MODELS points elsewhere, e.g. at freshly rebuilt ones.
MODELS_DIR = Path(os.environ.get("FORKING_MODELS", STUDY_DIR / "models"))

# ------------------------------------------------------------------------------------ fixed design
#: Method name -> overlay config on top of ``configs/forking/base.yaml``.
METHODS = {
    "grpo": "grpo.yaml",
    "clip_b": "clip_b.yaml",
    "random_mask": "random_mask.yaml",
    "clip_v": "clip_v.yaml",
    "clip_v_rescaled": "clip_v_rescaled.yaml",
    "entropy_bonus": "entropy_bonus.yaml",
    "clip_higher": "clip_higher.yaml",
}
PRIORITY_METHODS = ("grpo", "clip_b", "random_mask")
FORK_BASES = ("fork-s0", "fork-s1")
NEUTRAL_BASE = "chain"
NEUTRAL_METHODS = ("grpo", "clip_b", "random_mask", "clip_v_rescaled", "entropy_bonus", "clip_higher")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 150
EVAL_EVERY = 50
TEMPERATURES = (1.0, 0.7)
K_MAIN = 64  # pass@k for k = 1..64 on every class
K_RARE = 256  # and up to 256 on the rare classes, at the last step and at step 0 (base)
RARE_CLASSES = ("C", "D")
PRIMARY_K = 64
PRIMARY_T = 1.0
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Run:
    task: str  # "forking" or "chain"
    base: str
    method: str
    seed: int
    steps: int

    @property
    def name(self) -> str:
        return f"{self.task}__{self.base}__{self.method}__s{self.seed}"


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


def grid(args: argparse.Namespace) -> list[Run]:
    steps = 2 if args.smoke else STEPS
    if args.smoke:
        runs = [Run("forking", FORK_BASES[0], m, 0, steps) for m in ("grpo", "clip_b", "random_mask")]
        return runs + [Run("chain", NEUTRAL_BASE, "grpo", 0, steps)]
    if args.grid == "none":
        return []
    methods = PRIORITY_METHODS if args.grid == "priority" else tuple(METHODS)
    if args.methods:
        methods = tuple(m for m in args.methods.split(",") if m)
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise ValueError(f"--methods has unknown methods {unknown}; choose from {sorted(METHODS)}")
    bases = tuple(args.bases.split(",")) if args.bases else FORK_BASES
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    # Seed-major order: an interrupted study has every method at the first seeds rather than some methods only.
    runs = [Run("forking", b, m, s, steps) for s in seeds for b in bases if b != NEUTRAL_BASE for m in methods]
    if args.grid == "full" or NEUTRAL_BASE in bases:
        runs += [Run("chain", NEUTRAL_BASE, m, s, steps) for s in seeds[:3] for m in NEUTRAL_METHODS if m in methods]
    return runs


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
        f"--model.model_name_or_path={MODELS_DIR / run.base}",
        f"--data.train_dataset={data / 'train.jsonl'}",
        f"--data.seed={run.seed}",
        f"--trainer.default_root_dir={run_dir}",  # where LightningCLI saves the resolved config.yaml
        "--val_before_train=false",
    ]
    if smoke:
        args += ["--data.batch_size=4", "--model.group_size=4"]
    return args


# ------------------------------------------------------------------------------------- evaluation
def load_rows(task: str, split: str) -> list[dict[str, str]]:
    path = STUDY_DIR / "data" / task / f"{split}.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@torch.no_grad()
def sample_correct(
    policy: Any, tokenizer: Any, rows: list[dict[str, str]], samples: int, temperature: float, seed: int
) -> list[int]:
    """Correct completions out of ``samples`` per prompt; sampling is seeded and leaves the global RNG as it was."""
    from lit_entropy.data.forking import reward

    was_training = policy.training
    policy.eval()
    max_new = max(len(r["answer"]) for r in rows) + 2
    correct = []
    chunk = max(1, 2048 // samples)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            enc = tokenizer([r["prompt"] for r in part], return_tensors="pt", padding=True, add_special_tokens=False)
            out = policy.generate(
                input_ids=enc["input_ids"].repeat_interleave(samples, 0),
                attention_mask=enc["attention_mask"].repeat_interleave(samples, 0),
                do_sample=True,
                temperature=temperature,
                top_k=0,
                top_p=1.0,
                max_new_tokens=max_new,
                use_cache=True,
                eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id,
            )
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            scores = reward(texts, [r["answer"] for r in part for _ in range(samples)])
            correct += [int(sum(scores[i * samples : (i + 1) * samples])) for i in range(len(part))]
    policy.train(was_training)
    return correct


def evaluate(policy: Any, tokenizer: Any, run: Run, step: int, final: bool, smoke: bool) -> list[dict[str, Any]]:
    """Tidy rows (one per prompt and temperature) of one evaluation on the test split."""
    rows = load_rows(run.task, "test")
    if smoke:
        rows = rows[:: max(1, len(rows) // 8)][:8]
    temps = TEMPERATURES if final else (PRIMARY_T,)
    out = []
    for temp in temps:
        for rare in (False, True):
            part = [r for r in rows if (r["class"] in RARE_CLASSES) == rare]
            if not part:
                continue
            samples = K_RARE if (rare and final) else K_MAIN
            if smoke:
                samples = 4
            # Same sampling seed for every method and RL seed at a given step: common random numbers.
            correct = sample_correct(policy, tokenizer, part, samples, temp, seed=10_000 + step)
            for r, c in zip(part, correct, strict=True):
                out.append(
                    {
                        **_run_cols(run),
                        "step": step,
                        "temperature": temp,
                        "prompt": r["prompt"],
                        "class": r["class"],
                        "n": samples,
                        "c": c,
                    }
                )
    return out


def _run_cols(run: Run) -> dict[str, Any]:
    return {"task": run.task, "base": run.base, "method": run.method, "seed": run.seed}


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


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
            reward = trainer.callback_metrics.get("train/reward_mean")
            self.train_rows.append(
                {
                    **_run_cols(run),
                    "step": step,
                    "reward_mean": float(reward) if reward is not None else math.nan,
                    **self._pending,
                }
            )
            if step in eval_steps:
                final = step == max(eval_steps)
                self.eval_rows += evaluate(pl_module.policy, pl_module.tokenizer, run, step, final, smoke)

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
    _write_csv(run_dir / "eval.csv", recorder.eval_rows)
    _write_csv(run_dir / "train.csv", recorder.train_rows)
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
    rows = evaluate(policy, tokenizer, run, 0, final=True, smoke=smoke)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_csv(run_dir / "eval.csv", rows)
    (run_dir / "done").write_text(json.dumps({"seconds": round(time.perf_counter() - t0, 1), "steps": 0}) + "\n")


def execute(args: argparse.Namespace) -> None:
    runs = grid(args)
    index, count = (int(x) for x in args.shard.split("/"))
    bases = sorted({(r.task, r.base) for r in runs})
    for task, base in bases:
        run_dir = args.out / "runs" / f"{task}__{base}__base__s-1"
        if not (run_dir / "done").exists():
            evaluate_base(task, base, run_dir, args.smoke)
    for i, run in enumerate(runs):
        if i % count != index:
            continue
        run_dir = args.out / "runs" / run.name
        if (run_dir / "done").exists():
            continue
        t0 = time.perf_counter()
        train_one(run, run_dir, args.smoke)
        print(f"[forking_study] {run.name} done in {time.perf_counter() - t0:.0f}s", flush=True)


def collect(out: Path) -> None:
    """Concatenate every finished run into ``eval.csv`` and ``train.csv`` (sorted, so the files are stable)."""
    for table in ("eval", "train"):
        rows: list[dict[str, str]] = []
        for run_dir in sorted((out / "runs").glob("*")):
            path = run_dir / f"{table}.csv"
            if (run_dir / "done").exists() and path.exists():
                with path.open() as f:
                    rows += list(csv.DictReader(f))
        _write_csv(out / f"{table}.csv", rows)
    seconds = {}
    for run_dir in sorted((out / "runs").glob("*")):
        if (run_dir / "done").exists():
            seconds[run_dir.name] = json.loads((run_dir / "done").read_text())["seconds"]
    (out / "run_seconds.json").write_text(json.dumps(seconds, indent=1, sort_keys=True) + "\n")


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
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from forking_analysis import analyze

        analyze(args.out)


if __name__ == "__main__":
    main()

"""Sum-or-difference forking study (issue 24, experiment C): GRPO vs Clip_B vs a count-matched random mask.

The design, endpoint and decision rule are fixed in ``scripts/forking/experiments/sod/PREREGISTRATION.md``
(committed before the first run). Each run trains one arm from the task's base model
(``scripts/studies/sod/make_model.py``) with one RL seed and evaluates the policy exactly on the 150 test prompts
every ``EVAL_EVERY`` steps at T = 1.0: every prompt has one or two correct responses, so the probability p that
one sample is correct is the sum of their sequence probabilities (teacher forcing), avg@k = p and
pass@k = 1 - (1 - p)^k exactly. Per run it writes ``<exp>/per_run/<run>/{eval.csv,train.csv,done.json}``
(committed: small); a finished run is skipped, so the study resumes from what is committed.

    python -m scripts.studies.sod --status                       # which runs are done, which remain
    nice -n 19 python -m scripts.studies.sod --run               # run what remains (resumable; several workers ok)
    python -m scripts.studies.sod --analyze --update-readme      # tables, verdict, README block
    python -m scripts.studies.sod --experiment sod_clipv --status  # the Clip_V amendment (likewise --run, ...)
    python -m scripts.studies.sod --experiment sod_robust --validate  # E's base models at step 0, before any run

Arms of ``--experiment sod`` (the default, experiment C): ``grpo``; ``clip_b`` (mu 2.5); ``replay_mask`` (at every
step, as many random A < 0 tokens as the Clip_B run of the same seed masked at that step: needs that run first);
``replay_role`` (the same count per token role); ``grpo_null`` (GRPO with another data-order seed: the null
calibration). ``--experiment sod_clipv`` (``experiments/sod_clipv/PREREGISTRATION.md``): ``grpo``, ``clip_v``
(mu 8.5, cap 1e-4), ``clip_v_rescaled`` (mu 8.5, cap 0.072) and ``clip_b``, run under their own commit.
``--experiment sod_robust`` (issue 39, experiment E): ``grpo`` and Clip_B at mu 2.5 / 2.0 / 3.0 on three base
models (C's and two more SFT seeds); its runs are named ``<base>__<arm>__s<seed>`` and run unit by unit.
``--experiment sod_methods`` (issue 39, experiment F): fourteen methods at their papers' defaults on sod-s0 and
sod-s1; ``--steps`` counts rollout batches (a mini-batched arm takes 4 optimizer steps per batch) and ``train.csv``
records what each method acted on.
Experiments, arms and bases are defined in ``scripts/studies/sod/design.py``.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

from lit_entropy.settings import UpdateConfig
from lit_entropy.step.schedule import updates_per_batch
from scripts.studies import runner
from scripts.studies.controls import ReplayedCountMasking, RoleRecorder, read_counts
from scripts.studies.results import run_rows
from scripts.studies.runs import fit_and_record
from scripts.studies.sod.design import EXPERIMENTS, Experiment

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS_DIR = ROOT / "scripts" / "forking" / "experiments"
#: The task's base model and data (``model/``, ``data/``), shared by every experiment on the task; also the
#: results directory of experiment C.
EXP = EXPERIMENTS_DIR / "sod"
CONFIGS = ROOT / "configs" / "forking"
#: Arm -> method overlay on configs/forking/base.yaml + sod.yaml, of experiment C (the default).
ARMS = EXPERIMENTS["sod"].arms
SEEDS = EXPERIMENTS["sod"].seeds
STEPS = 400
EVAL_EVERY = 40
NULL_DATA_SEED_OFFSET = 1000
#: Paths whose last commit is the code revision a run records (results commits do not change it).
CODE_PATHS = (
    "lit_entropy",
    "configs/forking",
    "scripts/studies/sod/run.py",
    "scripts/studies/sod/design.py",
    "scripts/studies/design.py",
    "scripts/studies/controls.py",
    "scripts/studies/runs.py",
    "scripts/studies/runner.py",
    "scripts/studies/tasks",
)


#: A run: (base, arm, seed); base is None in a one-base experiment (C's base, runs named without it).
Key = tuple[str | None, str, int]


def run_name(arm: str, seed: int, base: str | None = None) -> str:
    return f"{arm}__s{seed}" if base is None else f"{base}__{arm}__s{seed}"


def model_dir(design: Experiment, base: str | None) -> Path:
    """The base model a run of ``design`` starts from (C's, ``sod/model``, when the design has one base)."""
    return EXP / "model" if base is None else EXPERIMENTS_DIR / design.bases[base]


def code_revision() -> str:
    """Last commit that touched :data:`CODE_PATHS` (:func:`scripts.studies.runner.code_revision`)."""
    return runner.code_revision(CODE_PATHS)


def cli_args(
    arm: str, seed: int, steps: int, run_dir: Path, arms: dict[str, str] = ARMS, model: Path = EXP / "model"
) -> list[str]:
    data_seed = seed + NULL_DATA_SEED_OFFSET if arm == "grpo_null" else seed
    return [
        "--config",
        str(CONFIGS / "base.yaml"),
        "--config",
        str(CONFIGS / "sod.yaml"),
        "--config",
        str(CONFIGS / arms[arm]),
        f"--seed_everything={seed}",
        f"--trainer.max_steps={steps}",
        f"--data.seed={data_seed}",
        f"--trainer.default_root_dir={run_dir}",
        "--val_before_train=false",
        f"--model.policy.model_name_or_path={model}",
        f"--data.train_dataset={EXP / 'data' / 'train.jsonl'}",
    ]


def updates_per_rollout_batch(overlay: str) -> int:
    """Optimizer steps per rollout batch of a run with method overlay ``overlay`` (``base.yaml`` + ``sod.yaml`` +
    it, later files winning): epochs x mini-batches of the data's prompts x samples (4 for F's ``kl_cov`` and
    ``grpo_mb4``, 1 for every other arm). ``train_one`` checks it against the configured module."""
    import yaml  # reason: only the runner reads the overlays

    prompts = samples = 0
    update: dict[str, Any] = {}
    for name in ("base.yaml", "sod.yaml", overlay):
        config = yaml.safe_load((CONFIGS / name).read_text()) or {}
        model = config.get("model") or {}
        prompts = (config.get("data") or {}).get("batch_size", prompts)
        samples = (model.get("sampling") or {}).get("num_samples", samples)
        update.update(model.get("update") or {})
    config = UpdateConfig(epochs=update.get("epochs", 1), mini_batch_size=update.get("mini_batch_size"))
    return updates_per_batch(int(prompts) * int(samples), config)


def test_rows() -> list[dict[str, str]]:
    path = EXP / "data" / "test.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@torch.no_grad()
def evaluate(policy: Any, tokenizer: Any, step: int, temperature: float = 1.0) -> list[dict[str, Any]]:
    """One row per test prompt: log p(correct) (log-sum over the correct responses) and log p(first token = R)."""
    was_training = policy.training
    policy.eval()
    rows = test_rows()
    seqs, starts, owner = [], [], []
    for i, r in enumerate(rows):
        p = tokenizer(r["prompt"], add_special_tokens=False)["input_ids"]
        for answer in r["answer"].split("|"):
            seqs.append(p + tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id])
            starts.append(len(p))
            owner.append(i)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
    att = torch.zeros_like(ids)
    for i, seq in enumerate(seqs):  # right padding: positions start at 0 on every row
        ids[i, : len(seq)] = torch.tensor(seq)
        att[i, : len(seq)] = 1
    logp = torch.log_softmax(
        policy(input_ids=ids, attention_mask=att, use_cache=False).logits.double() / temperature, -1
    )
    r_id = tokenizer.convert_tokens_to_ids("R")
    total = [[] for _ in rows]
    first_r = [0.0] * len(rows)
    for j, (seq, start, i) in enumerate(zip(seqs, starts, owner, strict=True)):
        tok = ids[j, start : len(seq)]
        total[i].append(logp[j, start - 1 : len(seq) - 1].gather(-1, tok[:, None]).sum())
        first_r[i] = float(logp[j, start - 1, r_id])
    policy.train(was_training)
    return [
        {
            "step": step,
            "temperature": temperature,
            "prompt": r["prompt"],
            "class": r["class"],
            "logp": f"{float(torch.logsumexp(torch.stack(t), 0)):.6g}",
            "logp_R": f"{lr:.6g}",
        }
        for r, t, lr in zip(rows, total, first_r, strict=True)
    ]


def train_one(
    arm: str,
    seed: int,
    steps: int,
    eval_every: int,
    exp: Path,
    design: Experiment = EXPERIMENTS["sod"],
    base: str | None = None,
) -> None:
    from lit_entropy.cli import cli_main

    name = run_name(arm, seed, base)
    run_dir = exp / "per_run" / name
    # Named by experiment too: two experiments' runs of one arm and seed may go side by side.
    scratch = Path(os.environ.get("FORKING_SCRATCH", "/tmp/forking_sod")) / f"{exp.name}__{name}"
    # ``steps`` counts rollout batches; trainer.max_steps counts optimizer steps (4 per batch for a mini-batched arm).
    updates = updates_per_rollout_batch(design.arms[arm])
    args = cli_args(arm, seed, steps * updates, scratch, design.arms, model_dir(design, base))
    cli = cli_main(args=args, run=False)
    rows = cli.datamodule.prompts_per_step() * cli.model.group_size()
    configured = updates_per_batch(rows, cli.model.settings.update)
    if configured != updates:
        raise RuntimeError(f"{arm}: the overlays give {updates} updates per rollout batch, the module {configured}")
    eval_rows: list[dict[str, Any]] = []

    def on_step(batch: int, pl_module: Any) -> None:  # batch: rollout batches trained so far
        if batch % eval_every == 0 or batch == steps:
            eval_rows.extend(evaluate(pl_module.policy, pl_module.tokenizer, batch))

    # Experiment F records what each method acts on; C's and E's train.csv keep their columns.
    recorder = RoleRecorder(on_step, updates_per_batch=updates, acted_on=design is EXPERIMENTS.get("sod_methods"))
    cli.trainer.callbacks.append(recorder)
    replay = None
    if arm.startswith("replay"):
        counts = read_counts(run_rows(exp, run_name("clip_b", seed, base), "train"))  # its Clip_B run first
        replay = ReplayedCountMasking(counts, by_role=arm == "replay_role", seed=seed)
        cli.trainer.callbacks.append(replay)
    fit_and_record(cli, recorder, eval_rows, replay, run_dir, steps, code_revision(), updates)


#: Experiment E's validity rule for a base model before RL (``experiments/sod_robust/PREREGISTRATION.md``).
SFT_TARGET = 0.86
MIN_PASS64 = 0.90
MIN_PASS64_DIFF = 0.50
P_R_RANGE = (0.15, 0.35)
MAX_P_R_GAP = 0.05


def base_failures(m: dict[str, float]) -> list[str]:
    """The pre-registered validity rule's failed conditions for one base (empty: valid). ``m`` holds the SFT
    report's ``val_self_consistency`` and the step-0 ``pass@64``, ``pass@64_diff``, ``p_R_diff``, ``p_R_sum``."""
    fails = []
    if m["val_self_consistency"] < SFT_TARGET:
        fails.append(f"SFT stopped below the target: self-consistency {m['val_self_consistency']:.3f} < {SFT_TARGET}")
    if m["pass@64"] < MIN_PASS64:
        fails.append(f"step-0 pass@64 {m['pass@64']:.3f} < {MIN_PASS64}")
    if m["pass@64_diff"] < MIN_PASS64_DIFF:
        fails.append(f"step-0 pass@64 on diff prompts {m['pass@64_diff']:.3f} < {MIN_PASS64_DIFF}")
    for cls in ("diff", "sum"):
        if not P_R_RANGE[0] <= m[f"p_R_{cls}"] <= P_R_RANGE[1]:
            fails.append(f"P(first token R) on {cls} prompts {m[f'p_R_{cls}']:.3f} outside {list(P_R_RANGE)}")
    if abs(m["p_R_diff"] - m["p_R_sum"]) > MAX_P_R_GAP:
        fails.append(f"P(R) differs by {abs(m['p_R_diff'] - m['p_R_sum']):.3f} > {MAX_P_R_GAP} between classes")
    return fails


def validate(design: Experiment, exp: Path, bases: tuple[str, ...] | None = None) -> dict[str, Any]:
    """Step-0 exact test metrics of each base model (C's evaluation) and the validity rule; writes
    ``<exp>/models/validation.json``. Run before any RL run of the experiment."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scripts.studies.sod.analysis import endpoint

    if not design.bases:
        raise ValueError("--validate checks the base models of an experiment with several (--experiment sod_robust)")
    out = {}
    for base in bases or tuple(design.bases):
        path = model_dir(design, base)
        policy = AutoModelForCausalLM.from_pretrained(path)
        rows = evaluate(policy, AutoTokenizer.from_pretrained(path), step=0)
        sft = json.loads((path / "sft_report.json").read_text())
        m = {"model": str(path.relative_to(ROOT)), "sft_seed": sft["seed"], "sft_steps": sft["sft_steps"]}
        m["val_self_consistency"] = sft["val_self_consistency"]
        m.update({k: round(v, 4) for k, v in endpoint(rows).items()})
        for cls in ("sum", "diff"):
            m.update({f"{k}_{cls}": round(v, 4) for k, v in endpoint(rows, cls).items()})
        m["failures"] = base_failures(m)
        m["valid"] = not m["failures"]
        out[base] = m
        print(f"[validate] {base}: {json.dumps(m)}", flush=True)
    (exp / "models").mkdir(parents=True, exist_ok=True)
    (exp / "models" / "validation.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


def planned(
    arms: tuple[str, ...],
    seeds: tuple[int, ...],
    design: Experiment = EXPERIMENTS["sod"],
    bases: tuple[str, ...] | None = None,
) -> list[Key]:
    """Seed-major, then base (in the design's order), then arm; Clip_B before the replay arms of its seed (they
    read its counts). A unit's arms are thus consecutive. ``bases`` defaults to the design's (None: one base)."""
    order = sorted(arms, key=lambda a: (a.startswith("replay"), list(design.arms).index(a)))
    chosen: tuple[str | None, ...] = (None,) if not design.bases else tuple(bases or design.bases)
    return [(b, a, s) for s in seeds for b in chosen for a in order]


def study(args: argparse.Namespace) -> runner.Study:
    """The runner's view of ``args.experiment``'s runs (a key is ``(base, arm, seed)``)."""
    design = EXPERIMENTS[args.experiment]
    return runner.arm_study(
        "forking_sod",
        "scripts.studies.sod",
        args,
        name=lambda key: run_name(key[1], key[2], key[0]),
        train=lambda key: train_one(key[1], key[2], args.steps, args.eval_every, args.exp, design, key[0]),
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", choices=tuple(EXPERIMENTS), default="sod")
    runner.add_arguments(p)
    p.add_argument("--arms", default=None, help="default: every arm of the experiment")
    p.add_argument("--seeds", default=None, help="default: the experiment's (0-7)")
    p.add_argument("--bases", default=None, help="default: the experiment's base models (experiments with several)")
    p.add_argument("--steps", type=int, default=STEPS, help="rollout batches per run")
    p.add_argument("--eval-every", type=int, default=EVAL_EVERY, help="evaluate every this many rollout batches")
    p.add_argument("--validate", action="store_true", help="step-0 metrics of the base models and the validity rule")
    args = p.parse_args(argv)
    design = EXPERIMENTS[args.experiment]
    args.exp = args.exp or EXPERIMENTS_DIR / design.directory
    arms = tuple(a for a in (args.arms or ",".join(design.arms)).split(",") if a)
    unknown = sorted(set(arms) - set(design.arms))
    if unknown:
        raise ValueError(
            f"--arms has unknown arms {unknown} for --experiment {args.experiment}; choose from {sorted(design.arms)}"
        )
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else design.seeds
    if args.bases is not None:
        args.bases = tuple(b for b in args.bases.split(",") if b)
        wrong = sorted(set(args.bases) - set(design.bases))
        if wrong:
            raise ValueError(
                f"--bases has unknown bases {wrong} for --experiment {args.experiment}; "
                f"choose from {sorted(design.bases) or 'none (one base model)'}"
            )
    runner.prepare(args)
    if args.validate:
        validate(design, args.exp, args.bases)
    keys = planned(arms, seeds, design, args.bases)
    if args.run and args.workers:
        # The design's first arms seed by seed (unit by unit) first, so a study cut short has whole units of their
        # comparisons; planned() is already seed, base, arm, and the sort is stable.
        keys = sorted(keys, key=lambda key: key[1] not in design.first)
    runner.run(study(args), keys, args)
    if args.analyze or args.update_readme:
        if design.bases:  # (base, seed) units and issue 39's rule
            from scripts.studies.sod.units import analyze_units

            analyze_units(args.exp, design, args.experiment, args.update_readme)
        else:
            from scripts.studies.sod.analysis import analyze

            analyze(args.exp, update_readme=args.update_readme, experiment=args.experiment)


if __name__ == "__main__":
    main()

"""The first-GPU check (issue 34): SmolLM2-135M-Instruct in bfloat16, 10 GRPO steps on the word problems, four ways,
one table. Run it as ``bash scripts/gpu_check.sh`` (this module does the work).

Parts, each a separate process with its own time limit (about 8 minutes in all on one modern GPU):

* ``hf``: lit_entropy, Hugging Face ``generate`` rollouts, one GPU;
* ``vllm``: lit_entropy with the vLLM engine, sleep mode on, CUDA graphs on (``enforce_eager: false``), token-level
  rollout correction so the mismatch metrics are logged;
* ``fsdp2``: lit_entropy with ``configs/fsdp2.yaml`` over every visible GPU (bf16-mixed);
* ``trl``: TRL's ``GRPOTrainer`` on the same model, prompts, group, lengths and learning rate, bf16.

Reported per part: median seconds per step (steps 2-10), peak GPU memory (MiB, CUDA max allocated on rank 0), the
mismatch KL between the rollout engine and the trainer (``train/rollout/kl_k3``, mean over steps; TRL: n/a), and
pass/fail (the process exited 0 within its limit and logged 10 finite steps).

On a machine without CUDA it only checks that every command it would run parses (``--print_config``) and says that
it needs a GPU; ``.ci/run`` runs that path.

    python -m scripts.bench.gpu_check               # the check (bash scripts/gpu_check.sh)
    python -m scripts.bench.gpu_check --cpu-parse   # the CPU path, also taken automatically without CUDA
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2_word_problems.yaml"
FSDP2 = ROOT / "configs" / "fsdp2.yaml"
MODEL = "smollm2-135m-instruct"
STEPS = 10
#: Seconds each part may run (the conversion of the packaged model comes first, once).
LIMITS = {"hf": 100, "vllm": 150, "fsdp2": 110, "trl": 90}


def lit_commands(out: Path, gpus: int) -> dict[str, list[str]]:
    """The ``lit-entropy fit`` argument lists of the lit_entropy parts (logs under ``out/<part>``)."""

    def common(part: str) -> list[str]:
        return [
            "fit",
            "--config",
            str(CONFIG),
            f"--model.policy.model_name_or_path={MODEL}",
            "--model.policy.dtype=bfloat16",
            f"--trainer.max_steps={STEPS}",
            "--trainer.accelerator=gpu",
            "--trainer.devices=1",
            "--trainer.limit_val_batches=0",
            "--trainer.enable_checkpointing=false",
            "--val_before_train=false",
            f"--trainer.logger.init_args.save_dir={out}",
            f"--trainer.logger.init_args.name={part}",
            "--model.logging.export_dir=null",
        ]

    vllm = [
        "--model.rollout=lit_entropy.rollout.VLLMRolloutEngine",
        "--model.rollout.init_args.enable_sleep=true",
        "--model.rollout.init_args.enforce_eager=false",
        "--model.rollout.init_args.dtype=bfloat16",
        "--model.rollout.init_args.gpu_memory_utilization=0.3",
        "--model.loss.rollout_correction.level=token",
    ]
    fsdp2 = [
        "--config",
        str(FSDP2),
        f"--trainer.devices={max(gpus, 1)}",
        "--model.policy.dtype=float32",  # fp32 master weights, bf16 compute
        "--trainer.precision=bf16-mixed",
    ]
    return {"hf": common("hf"), "vllm": common("vllm") + vllm, "fsdp2": common("fsdp2") + fsdp2}


def parse_only() -> int:
    """The CPU path: every lit_entropy command parses; TRL's config builds where TRL is installed."""
    from lit_entropy.cli import cli_main

    problems = []
    with tempfile.TemporaryDirectory() as tmp:
        for part, args in lit_commands(Path(tmp), 2).items():
            try:
                cli_main([*args, "--print_config"])
            except SystemExit as exit_info:
                if exit_info.code not in (0, None):
                    problems.append(f"{part}: exit {exit_info.code}")
                    continue
            print(f"gpu_check: {part}: the command parses", file=sys.stderr)
    try:
        trl_config(Path(tempfile.gettempdir()), use_cpu=True)
        print("gpu_check: trl: GRPOConfig builds", file=sys.stderr)
    except ImportError as err:
        print(f"gpu_check: trl: not installed here ({err}); its part needs pip install -e '.[bench]'", file=sys.stderr)
    if problems:
        print("gpu_check: FAILED to parse: " + "; ".join(problems))
        return 1
    print("gpu_check: every config parses; the check itself needs a CUDA GPU (none here)")
    return 0


def trl_config(out: Path, use_cpu: bool = False) -> Any:
    """TRL's ``GRPOConfig`` matching the lit_entropy parts (group 8, 64 new tokens, T = 1, lr 2e-6, 4 prompts a step,
    one update per rollout batch, token-mean loss, clip 0.2, no reference model)."""
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out),
        per_device_train_batch_size=32,  # 4 prompts x 8 completions
        num_generations=8,
        max_completion_length=64,
        temperature=1.0,
        learning_rate=2e-6,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        max_steps=STEPS,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        bf16=not use_cpu,
        use_cpu=use_cpu,
        seed=0,
    )


def trl_worker(out: Path) -> None:
    """Run TRL's part in this process and write its figures to ``out/trl.json``."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOTrainer

    from lit_entropy.data.word_problems import make_word_problems
    from lit_entropy.models.packaged import resolve_model_path
    from lit_entropy.rewards import word_problem_reward

    path = resolve_model_path(MODEL)
    tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    rows = make_word_problems("train", 4 * STEPS, seed=0, operations=(1, 1))
    data = datasets.Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in rows]
    )

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return word_problem_reward(texts, answer)

    times: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *args: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            self.start = time.perf_counter()

        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            torch.cuda.synchronize()
            times.append(time.perf_counter() - self.start)

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=trl_config(out / "trl_run"),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Timer()],
    )
    trainer.train()
    peak = torch.cuda.max_memory_allocated() / 2**20
    (out / "trl.json").write_text(json.dumps({"times": times, "peak_mib": peak}))


def lit_figures(log_dir: Path) -> dict[str, Any]:
    """Median s/step (sum of the ``perf/time_*`` phases, steps after the first), peak memory and mismatch KL."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    runs = sorted(log_dir.glob("version_*"))
    if not runs:
        return {}
    events = EventAccumulator(str(runs[-1]), size_guidance={"scalars": 0})
    events.Reload()
    tags = events.Tags()["scalars"]
    per_step: dict[int, float] = {}
    for tag in (t for t in tags if t.startswith("perf/time_")):
        for event in events.Scalars(tag):
            per_step[event.step] = per_step.get(event.step, 0.0) + event.value
    steps = [per_step[s] for s in sorted(per_step)]
    peak = (
        max((e.value for e in events.Scalars("perf/peak_memory_mb")), default=math.nan)
        if "perf/peak_memory_mb" in tags
        else math.nan
    )
    kl = [e.value for e in events.Scalars("train/rollout/kl_k3")] if "train/rollout/kl_k3" in tags else []
    return {
        "steps": len(steps),
        "s_per_step": statistics.median(steps[1:]) if len(steps) > 1 else math.nan,
        "peak_mib": peak,
        "kl": statistics.fmean(kl) if kl else math.nan,
    }


def run_part(part: str, command: list[str], out: Path) -> dict[str, Any]:
    start = time.perf_counter()
    try:
        code = subprocess.run(command, cwd=ROOT, timeout=LIMITS[part]).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    wall = time.perf_counter() - start
    if part == "trl":
        figures: dict[str, Any] = {"kl": math.nan}
        if (out / "trl.json").is_file():
            saved = json.loads((out / "trl.json").read_text())
            figures.update(steps=len(saved["times"]), peak_mib=saved["peak_mib"])
            figures["s_per_step"] = statistics.median(saved["times"][1:]) if len(saved["times"]) > 1 else math.nan
    else:
        figures = lit_figures(out / part)
    ok = code == 0 and figures.get("steps") == STEPS and math.isfinite(figures.get("s_per_step", math.nan))
    return {"part": part, "exit": code, "wall_s": wall, "passed": ok, **figures}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu-parse", action="store_true", help="only check that every command parses")
    parser.add_argument("--out", type=Path, default=None, help="log directory (default: a temporary one)")
    parser.add_argument("--trl-worker", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.trl_worker is not None:
        trl_worker(args.trl_worker)
        return 0
    import torch

    if args.cpu_parse or not torch.cuda.is_available():
        return parse_only()
    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_check_"))
    out.mkdir(parents=True, exist_ok=True)
    from lit_entropy.models.packaged import resolve_model_path

    resolve_model_path(MODEL)  # converted once, before any part's clock starts
    gpus = torch.cuda.device_count()
    lit = [sys.executable, "-m", "lit_entropy"]
    commands = {part: lit + args_ for part, args_ in lit_commands(out, gpus).items()}
    commands["trl"] = [sys.executable, "-m", "scripts.bench.gpu_check", "--trl-worker", str(out)]
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    rows = [run_part(part, command, out) for part, command in commands.items()]
    name = torch.cuda.get_device_name(0)
    print(f"\ngpu_check: {gpus} x {name}, torch {torch.__version__}, {STEPS} GRPO steps, {MODEL} bf16, logs in {out}")
    print("| part | passed | s/step (median) | peak GPU MiB | mismatch KL (k3) | exit | wall s |")
    print("|---|---|---|---|---|---|---|")
    for row in rows:
        print(
            f"| {row['part']} | {'yes' if row['passed'] else 'NO'} | {row.get('s_per_step', math.nan):.3f} "
            f"| {row.get('peak_mib', math.nan):.0f} | {row.get('kl', math.nan):.2e} | {row['exit']} "
            f"| {row['wall_s']:.0f} |"
        )
    return 0 if all(row["passed"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

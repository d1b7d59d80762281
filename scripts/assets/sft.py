"""Supervised fine-tuning of a tiny base model: the teacher-forcing loop every base-model builder shares.

The embedded default (``make_tiny_model``), the agent demonstrations' models (``make_calculator_model``,
``make_guessing_model``) and the studies' base models (``scripts.studies.forking.make_models``,
``scripts.studies.sod.make_model``) teach a freshly initialised tiny Qwen2 the same way: AdamW without weight
decay, a warm-up schedule, the gradient norm clipped at 1, and a check every ``eval_every`` steps that stops the
SFT *early*, at the first check that reaches the builder's target (the base model must be unsure, or reinforcement
learning has nothing to learn). Each builder brings its batches, its check and its target; the loop, the batch
layout and the written model directory are the same, so a model built with the same seed is bit-identical
whichever builder's copy of the loop it went through.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from lit_entropy.models.tiny import build_qwen2

__all__ = [
    "Supervised",
    "add_sft_arguments",
    "arguments",
    "builder_parser",
    "build_model",
    "make_batch",
    "pad_right",
    "report",
    "sample",
    "sampled_ids",
    "save",
    "supervise",
    "warm_up",
    "write_report",
]


def builder_parser(description: str, out: Path) -> argparse.ArgumentParser:
    """A builder's command line with ``--out`` (default ``out``), ``--seed`` and ``--threads``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    return parser


def add_sft_arguments(
    parser: argparse.ArgumentParser, *, max_steps: int, eval_every: int, lr: float = 3e-3, batch_size: int = 64
) -> None:
    """The SFT options every builder takes (``--lr``, ``--batch-size``, ``--max-steps``, ``--eval-every``), with the
    builder's defaults."""
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--max-steps", type=int, default=max_steps, help="hard cap on SFT steps")
    parser.add_argument("--eval-every", type=int, default=eval_every, help="SFT steps between early-stop checks")


def warm_up(steps: int) -> Callable[[int], float]:
    """Learning-rate factor rising linearly to 1 over ``steps`` optimizer steps, then constant."""
    return lambda s: min(1.0, (s + 1) / steps)


def build_model(
    tokenizer: Any, seed: int, max_new_tokens: int, num_layers: int = 2, hidden_size: int = 128, **shape: int
) -> Qwen2ForCausalLM:
    """A tied-head Qwen2 with heads of 64 (vLLM-servable), one KV head and an MLP twice the hidden size, unless
    ``shape`` says otherwise (``intermediate_size``, ``num_heads``, ``num_kv_heads``)."""
    shape = {"intermediate_size": 2 * hidden_size, "num_heads": hidden_size // 64, "num_kv_heads": 1, **shape}
    if hidden_size // shape["num_heads"] != 64:
        raise ValueError(f"hidden_size / num_heads must be 64 (vLLM), got {hidden_size}/{shape['num_heads']}")
    return build_qwen2(
        tokenizer, hidden_size=hidden_size, num_layers=num_layers, seed=seed, max_new_tokens=max_new_tokens, **shape
    )


def pad_right(rows: list[list[int]], labels: list[list[int]], pad_token_id: int) -> dict[str, torch.Tensor]:
    """Token rows and their labels as a right-padded batch (``input_ids``, ``attention_mask``, ``labels``: ``[B, T]``;
    padding is ``pad_token_id`` in the ids, 0 in the mask and -100, ignored by the loss, in the labels)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    att = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, lb) in enumerate(zip(rows, labels, strict=True)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(lb)] = torch.tensor(lb)
        att[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": att, "labels": lab}


def make_batch(examples: list[dict[str, str]], tokenizer: PreTrainedTokenizerFast) -> dict[str, torch.Tensor]:
    """Right-padded teacher-forcing batch of ``{"prompt", "answer"}`` rows; labels are -100 except on answer + eos."""
    rows, labels = [], []
    for ex in examples:
        p_ids = tokenizer(ex["prompt"], add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(ex["answer"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(p_ids + a_ids)
        labels.append([-100] * len(p_ids) + a_ids)
    return pad_right(rows, labels, tokenizer.pad_token_id)


@torch.no_grad()
def sampled_ids(
    model: Any, tokenizer: Any, inputs: dict[str, torch.Tensor], max_new_tokens: int, samples: int = 1
) -> torch.Tensor:
    """``model.generate`` at T = 1 without top-k / top-p: ``samples`` sequences per row of ``inputs``
    (``input_ids``, ``attention_mask``), prompt ids included, each ending at the tokenizer's ``<eos>``."""
    return model.generate(
        **inputs,
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        num_return_sequences=samples,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def sample(
    model: Any, tokenizer: Any, prompts: list[str], *, samples: int, seed: int, max_new_tokens: int
) -> list[str]:
    """``samples`` completions per prompt (prompt-major), sampled at T = 1 without top-k / top-p after
    ``torch.manual_seed(seed)``; the model is left in training mode."""
    model.eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    out = sampled_ids(model, tokenizer, enc, max_new_tokens, samples)
    model.train()
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


@dataclass(frozen=True)
class Supervised:
    """How an SFT ended: optimizer steps taken, the last check's numbers (empty if none ran) and the last loss."""

    steps: int
    stats: dict[str, float]
    loss: float


def supervise(
    model: Qwen2ForCausalLM,
    next_batch: Callable[[], dict[str, torch.Tensor]],
    check: Callable[[], dict[str, float]],
    done: Callable[[dict[str, float]], bool],
    *,
    lr: float,
    max_steps: int,
    eval_every: int,
    schedule: Callable[[int], float] | None = None,
    tag: str = "",
) -> Supervised:
    """Teacher-force ``model`` on ``next_batch()`` batches for at most ``max_steps`` steps; every ``eval_every``
    steps print ``check()``'s numbers and stop once ``done`` says they reach the target.

    AdamW (betas 0.9 / 0.98, no weight decay) at ``lr`` times ``schedule(step)`` (default: 100 warm-up steps), the
    gradient norm clipped at 1. ``next_batch`` draws from the builder's own random stream, once per step, before
    the step, so the batches, and hence the weights, depend only on the builder's seed.
    """
    t0 = time.perf_counter()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.98))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule or warm_up(100))
    step, stats, loss = 0, {}, torch.tensor(float("nan"))
    model.train()
    while step < max_steps:
        loss = model(**next_batch()).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % eval_every == 0:
            stats = check()
            shown = " ".join(f"{k}={v:.3f}" for k, v in stats.items())
            print(f"{tag}step={step} loss={loss.item():.4f} {shown} t={time.perf_counter() - t0:.0f}s", flush=True)
            if done(stats):
                break
    return Supervised(step, stats, loss.item())


def report(sft: Supervised, model: Qwen2ForCausalLM, t0: float, **fields: Any) -> dict[str, Any]:
    """An SFT report: its steps, the model's parameters, the seconds since ``t0``, then ``fields``."""
    params = sum(p.numel() for p in model.parameters())
    return {"sft_steps": sft.steps, "params": params, "seconds": round(time.perf_counter() - t0, 1), **fields}


def save(model: Qwen2ForCausalLM, tokenizer: PreTrainedTokenizerFast, out: Path) -> int:
    """Write ``model`` (safetensors) and ``tokenizer`` to ``out``, world-readable; returns the bytes written."""
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for f in out.iterdir():  # safetensors writes 0600; package data must be world-readable
        if f.is_file():
            f.chmod(0o644)
    return sum(f.stat().st_size for f in out.iterdir() if f.is_file())


def write_report(out: Path, report: dict[str, Any]) -> None:
    """``out/sft_report.json`` (the SFT's steps, numbers and arguments), also printed as one line."""
    (out / "sft_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report), flush=True)


def arguments(args: argparse.Namespace) -> dict[str, Any]:
    """A builder's command-line arguments for its report (paths as text; the output directory left out)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}

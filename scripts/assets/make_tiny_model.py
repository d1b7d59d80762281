"""Build the embedded default model ``lit_entropy/assets/tiny-qwen2-arith``.

A tiny Qwen2 (head_dim 64 so vLLM can serve it) with a char-level tokenizer is warm-started by teacher
forcing on the synthetic arithmetic train split (loss on answer + ``<eos>`` only), and the SFT is stopped
*deliberately early*: at the first evaluation whose sampled (T=1.0) validation accuracy reaches
``--target-acc``. The shipped model is therefore right, but unsure, on many prompts, which is what GRPO needs
(reward variance inside each group of samples) and leaves entropy room to fall.

Usage::

    pip install -e .   # or prefix the next line with PYTHONPATH=.
    python -m scripts.assets.make_tiny_model   # ~1.5 min on 2 idle CPU cores; deterministic (bit-identical output)
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from lit_entropy.data.arithmetic import DEFAULT_MAX_OPERAND, arithmetic_split_size, make_arithmetic_examples
from lit_entropy.data.char_tokenizer import build_char_tokenizer
from scripts.assets.sft import add_sft_arguments, arguments, build_model, make_batch, save, supervise, warm_up

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "lit_entropy" / "assets" / "tiny-qwen2-arith"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="asset directory to (over)write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    p.add_argument("--max-operand", type=int, default=DEFAULT_MAX_OPERAND)
    p.add_argument("--operations", default="+-")
    p.add_argument("--hidden-size", type=int, default=128)
    p.add_argument("--num-heads", type=int, default=2, help="attention heads; head_dim = hidden / heads = 64")
    p.add_argument("--num-kv-heads", type=int, default=1)
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--intermediate-size", type=int, default=256)
    add_sft_arguments(p, max_steps=3000, eval_every=25, lr=2e-3)
    p.add_argument("--eval-prompts", type=int, default=128, help="val prompts per early-stop check")
    p.add_argument("--target-acc", type=float, default=0.38, help="stop once sampled T=1 val acc reaches this")
    p.add_argument("--final-prompts", type=int, default=512, help="val prompts in the final report")
    p.add_argument("--samples", type=int, default=8, help="samples per prompt (the GRPO group size)")
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(
    model: Qwen2ForCausalLM,
    tokenizer: PreTrainedTokenizerFast,
    examples: list[dict[str, str]],
    *,
    temperature: float | None,
    samples: int,
    seed: int,
) -> tuple[float, float]:
    """Sampled (or greedy when ``temperature`` is None) accuracy and the fraction of prompts whose
    ``samples`` completions are neither all right nor all wrong."""
    model.eval()
    enc = tokenizer([ex["prompt"] for ex in examples], return_tensors="pt", padding=True, add_special_tokens=False)
    max_answer = max(len(ex["answer"]) for ex in examples)
    gen_kwargs = {"do_sample": False, "num_return_sequences": 1}
    if temperature is not None:
        gen_kwargs = {
            "do_sample": True,
            "temperature": temperature,
            "top_k": 0,
            "top_p": 1.0,
            "num_return_sequences": samples,
        }
    torch.manual_seed(seed)
    out = model.generate(
        **enc,
        max_new_tokens=max_answer + 2,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **gen_kwargs,
    )
    texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    k = gen_kwargs["num_return_sequences"]
    correct = [t == examples[i // k]["answer"] for i, t in enumerate(texts)]
    per_prompt = [sum(correct[i * k : (i + 1) * k]) for i in range(len(examples))]
    mixed = sum(0 < c < k for c in per_prompt) / len(examples)
    model.train()
    return sum(correct) / len(correct), mixed


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    random.seed(args.seed)
    t0 = time.perf_counter()
    tokenizer = build_char_tokenizer()
    shape = {
        "intermediate_size": args.intermediate_size,
        "num_heads": args.num_heads,
        "num_kv_heads": args.num_kv_heads,
    }
    model = build_model(tokenizer, args.seed, 6, args.num_layers, args.hidden_size, **shape)
    n_params = sum(p.numel() for p in model.parameters())
    ds_kwargs = {"max_operand": args.max_operand, "operations": args.operations}
    n_train = arithmetic_split_size("train", **ds_kwargs)
    train = make_arithmetic_examples("train", n_train, seed=args.seed, **ds_kwargs)
    n_val = arithmetic_split_size("validation", **ds_kwargs)
    val_small = make_arithmetic_examples("validation", min(args.eval_prompts, n_val), seed=args.seed, **ds_kwargs)
    val_final = make_arithmetic_examples("validation", min(args.final_prompts, n_val), seed=args.seed, **ds_kwargs)
    print(f"params={n_params} train_problems={n_train} val_problems={n_val}", flush=True)

    rng = random.Random(args.seed)
    order: list[int] = []

    def next_batch() -> dict[str, torch.Tensor]:
        nonlocal order
        if len(order) < args.batch_size:  # new epoch: reshuffle, drop the ragged tail
            order = list(range(n_train))
            rng.shuffle(order)
        return make_batch([train[order.pop()] for _ in range(args.batch_size)], tokenizer)

    def check() -> dict[str, float]:
        acc, mixed = evaluate(model, tokenizer, val_small, temperature=1.0, samples=4, seed=args.seed)
        return {"val_acc@T1": acc, "mixed": mixed}

    sft = supervise(
        model,
        next_batch,
        check,
        lambda stats: stats["val_acc@T1"] >= args.target_acc,
        lr=args.lr,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        schedule=warm_up(50),
    )
    step = sft.steps
    if sft.stats.get("val_acc@T1", 0.0) < args.target_acc:
        print(f"warning: target_acc {args.target_acc} not reached in {args.max_steps} steps", flush=True)

    results = {"sft_steps": step, "params": n_params, "val_prompts": len(val_final), "samples": args.samples}
    for name, temp in (("T1.0", 1.0), ("T0.7", 0.7)):
        a, m = evaluate(model, tokenizer, val_final, temperature=temp, samples=args.samples, seed=args.seed + 1)
        results[f"val_acc_{name}"] = round(a, 4)
        results[f"mixed_frac_{name}"] = round(m, 4)
    results["val_acc_greedy"] = round(
        evaluate(model, tokenizer, val_final, temperature=None, samples=1, seed=args.seed)[0], 4
    )

    size = save(model, tokenizer, args.out)
    results["size_bytes"] = size
    results["seconds"] = round(time.perf_counter() - t0, 1)
    results["args"] = arguments(args)
    (args.out / "sft_report.json").write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    print(
        f"wrote {args.out} ({size / 2**20:.2f} MiB, {n_params} params, {step} SFT steps, "
        f"sampled val acc T=1.0 {results['val_acc_T1.0']:.3f}, T=0.7 {results['val_acc_T0.7']:.3f}, "
        f"greedy {results['val_acc_greedy']:.3f}; prompts with 0<correct<{args.samples} at T=1.0: "
        f"{results['mixed_frac_T1.0']:.2f})"
    )
    assert math.isfinite(sft.loss)


if __name__ == "__main__":
    main()

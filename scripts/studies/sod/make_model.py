"""Build the base model and RL data of the sum-or-difference forking task (``scripts.studies.tasks.sum_or_difference``).

A tiny Qwen2 (2 layers, hidden 128, ~0.3M parameters, char tokenizer) is supervised on train-split responses
whose strategy is ``L`` with probability ``SOD_BASE_PRIOR_L`` (0.75) *whatever the rule*, arithmetic always
right, and stopped at the first check where sampled (T = 1) validation responses are a correct execution of
their own strategy at least ``--target`` of the time: it executes both strategies, imperfectly, and has not
learnt the rule. Writes ``<out>/model`` and ``<out>/data/{train,validation,test}.jsonl``.

    python -m scripts.studies.sod.make_model --out scripts/forking/experiments/sod      # ~2 min at 1 thread
    # experiment E's bases: another SFT seed, C's data (the splits do not depend on the seed)
    python -m scripts.studies.sod.make_model --out scripts/forking/experiments/sod_robust/models/sod-s1 --seed 1 \\
        --model-only
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from scripts.assets.sft import add_sft_arguments, build_model, make_batch, sample, save, supervise, write_report
from scripts.studies.tasks.forking import write_splits
from scripts.studies.tasks.sum_or_difference import (
    SOD_ALPHABET,
    SOD_BASE_PRIOR_L,
    SOD_SPLITS,
    make_sod_examples,
    parse_prompt,
    strategy_response,
)

MAX_NEW_TOKENS = 10  # longest response "L99+9=108" is 9 tokens, then <eos>


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="experiment directory: model/ and data/")
    p.add_argument("--seed", type=int, default=0, help="SFT seed: initialisation, SFT examples and their order")
    p.add_argument("--model-only", action="store_true", help="write <out> as the model directory, no data splits")
    p.add_argument("--threads", type=int, default=1)
    add_sft_arguments(p, max_steps=4000, eval_every=50)
    p.add_argument("--target", type=float, default=0.86, help="stop at this sampled self-consistency")
    return p.parse_args(argv)


def sampled_stats(model, tokenizer, rows: list[dict[str, str]], samples: int, seed: int) -> dict[str, float]:
    """Self-consistency (a sample is its own strategy executed right), task accuracy and P(L) at T = 1."""
    prompts = [r["prompt"] for r in rows]
    texts = sample(model, tokenizer, prompts, samples=samples, seed=seed, max_new_tokens=MAX_NEW_TOKENS)
    own = right = n_l = 0
    for i, t in enumerate(texts):
        row = rows[i // samples]
        a, b = parse_prompt(row["prompt"])
        own += t[:1] in "LR" and bool(t) and t == strategy_response(t[0], a, b)
        right += t in row["answer"].split("|")
        n_l += t[:1] == "L"
    n = len(texts)
    return {"self_consistency": own / n, "task_acc": right / n, "p_L": n_l / n}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = build_char_tokenizer(SOD_ALPHABET, model_max_length=32)
    if not args.model_only:
        write_splits(args.out / "data", {s: make_sod_examples(s) for s in SOD_SPLITS})
    rows = make_sod_examples("train", seed=1000 + args.seed, prior_l=SOD_BASE_PRIOR_L, n=200_000)
    val = make_sod_examples("validation")
    model = build_model(tokenizer, args.seed, MAX_NEW_TOKENS)
    rng = random.Random(args.seed)
    sft = supervise(
        model,
        lambda: make_batch([rows[rng.randrange(len(rows))] for _ in range(args.batch_size)], tokenizer),
        lambda: sampled_stats(model, tokenizer, val, samples=8, seed=args.seed),
        lambda stats: stats["self_consistency"] >= args.target,
        lr=args.lr,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
    )
    out = args.out if args.model_only else args.out / "model"
    save(model, tokenizer, out)
    report = {
        "seed": args.seed,
        "params": sum(p.numel() for p in model.parameters()),
        "sft_steps": sft.steps,
        "seconds": round(time.perf_counter() - t0, 1),
        **{f"val_{k}": round(v, 4) for k, v in sft.stats.items()},
    }
    write_report(out, report)


if __name__ == "__main__":
    main()

"""Build the base models of the forking-decision testbed (``scripts.studies.tasks.forking``).

Each base model is a ~0.6M-parameter Qwen2 (4 layers, hidden 128, head_dim 64 so vLLM could serve it)
with a character-level tokenizer, warm-started by teacher forcing:

* ``fork-s<seed>``: forking task; the strategy letter of every training response is drawn from the skewed
  prior ``BASE_STRATEGY_PRIOR`` (75/15/7/3%) *whatever the key*, the rest is the chosen strategy executed
  correctly. The base model thus executes every strategy but has not learnt the rule: a minority strategy is
  right on a minority of prompts and sampled on a minority of tries, the regime of arXiv 2602.03392.
  Trained until sampled (T=1) responses are a correct execution of their own strategy >= ``--exec-target``.
* ``chain``: the neutral chain-sum task, stopped early at sampled accuracy >= ``--chain-target`` so RL has
  something to learn.

Also writes the RL data splits (``<out>/../data/forking`` and ``.../chain``: train/validation/test jsonl).

    python -m scripts.studies.forking.make_models                    # 2 forking bases + chain, ~10 min at 1 thread
    python -m scripts.studies.forking.make_models --only fork-s1     # one model
    python -m scripts.studies.forking.make_models --payload-copies 1 --out scripts/forking/experiments/short \
        --only data   # then --only fork-s0, --only fork-s1: issue 24 experiment B's short-execution task
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from scripts.assets.sft import add_sft_arguments, build_model, make_batch, sample, save, supervise, write_report
from scripts.studies.tasks.forking import (
    BASE_STRATEGY_PRIOR,
    CHAIN_SPLITS,
    CLASS_PROBS,
    FORKING_ALPHABET,
    STRATEGIES,
    STUDY_SPLITS,
    apply_strategy,
    make_chain_examples,
    make_forking_examples,
    study_split,
    write_splits,
)

ROOT = Path(__file__).resolve().parents[3] / "scripts" / "forking"
FORK_SEEDS = (0, 1)
# RL data: the task module's study splits (train from the task distribution, validation / test stratified).
FORK_SPLITS = STUDY_SPLITS
MAX_NEW_TOKENS = 31


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT, help="root: models/<name>, data/<task>")
    p.add_argument("--only", default=None, help="build only this model (fork-s0, fork-s1, chain) or 'data'")
    p.add_argument("--threads", type=int, default=1)
    add_sft_arguments(p, max_steps=500, eval_every=100)
    p.add_argument("--exec-target", type=float, default=0.95, help="forking: stop at this execution accuracy")
    p.add_argument("--chain-target", type=float, default=0.35, help="chain: stop at this sampled accuracy")
    p.add_argument(
        "--payload-copies", type=int, default=4, help="forking: copies of the payload per response (1: issue 24 B)"
    )
    return p.parse_args(argv)


def fork_stats(rows: list[dict[str, str]], texts: list[str], copies: int = 4) -> dict[str, float]:
    """Execution accuracy (response = its own strategy executed), task accuracy and strategy frequencies."""
    n = len(texts)
    executed = sum(
        bool(t) and t[0] in STRATEGIES and t == apply_strategy(t[0], r["prompt"][1:-1], copies)
        for r, t in zip(rows, texts, strict=True)
    )
    right = sum(t == apply_strategy(r["class"], r["prompt"][1:-1], copies) for r, t in zip(rows, texts, strict=True))
    stats = {"exec_acc": executed / n, "task_acc": right / n}
    for s in STRATEGIES:
        stats[f"p_{s}"] = sum(t[:1] == s for t in texts) / n
    return stats


def train(name: str, args: argparse.Namespace, tokenizer, train_rows, val_rows, seed: int) -> dict:
    """SFT of base model ``name`` (4 layers, hidden 128, ~0.6M parameters) on epochs of ``train_rows``, checked on
    ``val_rows``; writes ``<out>/models/<name>``."""
    t0 = time.perf_counter()
    model = build_model(tokenizer, seed, MAX_NEW_TOKENS, num_layers=4)
    rng = random.Random(seed)
    order: list[int] = []
    is_fork = name.startswith("fork")

    def next_batch() -> dict[str, torch.Tensor]:
        nonlocal order
        if len(order) < args.batch_size:
            order = list(range(len(train_rows)))
            rng.shuffle(order)
        return make_batch([train_rows[order.pop()] for _ in range(args.batch_size)], tokenizer)

    def check() -> dict[str, float]:
        prompts = [r["prompt"] for r in val_rows]
        texts = sample(model, tokenizer, prompts, samples=1, seed=seed, max_new_tokens=MAX_NEW_TOKENS)
        if is_fork:
            return fork_stats(val_rows, texts, args.payload_copies)
        return {"task_acc": sum(t == r["answer"] for r, t in zip(val_rows, texts, strict=True)) / len(texts)}

    def done(stats: dict[str, float]) -> bool:
        return stats["exec_acc"] >= args.exec_target if is_fork else stats["task_acc"] >= args.chain_target

    sft = supervise(
        model,
        next_batch,
        check,
        done,
        lr=args.lr,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
        # Warm-up, then linear decay to 10% at max_steps: a constant rate leaves execution accuracy oscillating.
        schedule=lambda s: min((s + 1) / 100, 1.0 - 0.9 * min(s / args.max_steps, 1.0)),
        tag=f"[{name}] ",
    )
    out = args.out / "models" / name
    size = save(model, tokenizer, out)
    report = {
        "name": name,
        "seed": seed,
        "params": sum(p.numel() for p in model.parameters()),
        "sft_steps": sft.steps,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    report.update({f"val_{k}": round(v, 4) for k, v in sft.stats.items()})
    report["size_bytes"] = size
    write_report(out, report)
    return report


def write_data(root: Path, copies: int = 4) -> None:
    fork = {split: study_split(split, copies) for split in FORK_SPLITS}
    write_splits(root / "data" / "forking", fork)
    if copies != 4:  # the short-execution variant has no chain task of its own
        return
    chain = {split: make_chain_examples(split, n, seed=0) for split, n in CHAIN_SPLITS.items()}
    write_splits(root / "data" / "chain", chain)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    tokenizer = build_char_tokenizer(FORKING_ALPHABET, model_max_length=64)
    if args.only in (None, "data"):
        write_data(args.out, args.payload_copies)
    names = [f"fork-s{s}" for s in FORK_SEEDS] + ["chain"]
    for name in names:
        if args.only not in (None, name):
            continue
        if name.startswith("fork"):
            seed = int(name.split("-s")[1])
            # The SFT draws its own payloads (seed 1000 + s) from the train split; class mix as in the task.
            copies = args.payload_copies
            rows = make_forking_examples(
                "train", 20000, seed=1000 + seed, strategy_prior=BASE_STRATEGY_PRIOR, payload_copies=copies
            )
            val = make_forking_examples("validation", 256, seed=1000 + seed, payload_copies=copies)
        else:
            seed = 0
            rows = make_chain_examples("train", 20000, seed=1000)
            val = make_chain_examples("validation", 256, seed=1000)
        train(name, args, tokenizer, rows, val, seed)
    assert abs(sum(CLASS_PROBS) - 1) < 1e-9


if __name__ == "__main__":
    main()

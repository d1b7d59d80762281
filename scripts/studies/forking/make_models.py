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
import json
import random
import time
from pathlib import Path

import torch
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.models.tiny import build_qwen2
from scripts.assets.make_tiny_model import make_batch  # the same teacher-forcing batch
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=ROOT, help="root: models/<name>, data/<task>")
    p.add_argument("--only", default=None, help="build only this model (fork-s0, fork-s1, chain) or 'data'")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=500)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--exec-target", type=float, default=0.95, help="forking: stop at this execution accuracy")
    p.add_argument("--chain-target", type=float, default=0.35, help="chain: stop at this sampled accuracy")
    p.add_argument(
        "--payload-copies", type=int, default=4, help="forking: copies of the payload per response (1: issue 24 B)"
    )
    return p.parse_args(argv)


def build_model(tokenizer: PreTrainedTokenizerFast, seed: int) -> Qwen2ForCausalLM:
    """4 layers, hidden 128, 2 heads of 64 (vLLM-servable), ~0.6M parameters."""
    return build_qwen2(
        tokenizer,
        hidden_size=128,
        intermediate_size=256,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        seed=seed,
        max_new_tokens=31,
    )


@torch.no_grad()
def sample(model, tokenizer, prompts: list[str], *, temperature: float, seed: int) -> list[str]:
    model.eval()
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    torch.manual_seed(seed)
    out = model.generate(
        **enc, do_sample=True, temperature=temperature, top_k=0, top_p=1.0, max_new_tokens=31, use_cache=True
    )
    model.train()
    return tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)


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
    t0 = time.perf_counter()
    model = build_model(tokenizer, seed)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.98))
    # Warm-up, then linear decay to 10% at max_steps: a constant rate leaves execution accuracy oscillating.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min((s + 1) / 100, 1.0 - 0.9 * min(s / args.max_steps, 1.0))
    )
    rng = random.Random(seed)
    order: list[int] = []
    is_fork = name.startswith("fork")
    step, stats = 0, {}
    model.train()
    while step < args.max_steps:
        if len(order) < args.batch_size:
            order = list(range(len(train_rows)))
            rng.shuffle(order)
        loss = model(**make_batch([train_rows[order.pop()] for _ in range(args.batch_size)], tokenizer)).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        step += 1
        if step % args.eval_every == 0:
            texts = sample(model, tokenizer, [r["prompt"] for r in val_rows], temperature=1.0, seed=seed)
            if is_fork:
                stats = fork_stats(val_rows, texts, args.payload_copies)
                done = stats["exec_acc"] >= args.exec_target
            else:
                stats = {"task_acc": sum(t == r["answer"] for r, t in zip(val_rows, texts, strict=True)) / len(texts)}
                done = stats["task_acc"] >= args.chain_target
            shown = " ".join(f"{k}={v:.3f}" for k, v in stats.items())
            print(f"[{name}] step={step} loss={loss.item():.4f} {shown} t={time.perf_counter() - t0:.0f}s", flush=True)
            if done:
                break
    out = args.out / "models" / name
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for f in out.iterdir():  # safetensors writes 0600
        f.chmod(0o644)
    report = {
        "name": name,
        "seed": seed,
        "params": params,
        "sft_steps": step,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    report.update({f"val_{k}": round(v, 4) for k, v in stats.items()})
    report["size_bytes"] = sum(f.stat().st_size for f in out.iterdir())
    (out / "sft_report.json").write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report), flush=True)
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

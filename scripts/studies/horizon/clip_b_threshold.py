"""Where Clip_B's threshold sits at step 0 on the forking task, with 29-token (experiment A) or 8-token (B) responses.

Clip_B masks an A < 0 token when its discriminator ``S = p (H + log p)`` is more than ``mu`` batch-std below the
batch mean (``lit_entropy.functional.clip_b_mask``). The batch moments run over every response token. The strategy
token (response position 0) has most of the batch's spread of S, while the near-deterministic execution tokens
have S ~ 0, so the shorter the execution, the larger the std and the lower the threshold. This script samples
batches like the RL step's (8 train prompts x 8 samples, T = 1.0, group-scaled GRPO advantages) from a base model
and prints, per base: the mean threshold ``m - mu * s``, the batch std, the masked tokens per batch by role, and the
strategy token's S per sampled letter (count, mean). No training: it shows what Clip_B could mask at step 0.

    python -m scripts.studies.horizon.clip_b_threshold --experiment horizon   # 29-token responses, A's base models
    python -m scripts.studies.horizon.clip_b_threshold --experiment short     # 8-token responses, B's base models
"""

from __future__ import annotations

import argparse
import json
from statistics import fmean
from typing import Any

import torch

from lit_entropy.functional import clip_b_mask, entropy_discriminator, grpo_advantages
from scripts.assets.sft import sampled_ids
from scripts.studies.horizon.run import BASES, EXPERIMENTS

GROUP = 8
PROMPTS = 8


def response_stats(model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, seed: int) -> dict[str, Any]:
    """Sample one response per prompt (T = 1.0); return the texts, the valid-token mask ``[B, T]`` (through the first
    ``<eos>``) and per token ``log p`` of the sampled token and the entropy H of the next-token distribution."""
    enc = tokenizer(prompts, return_tensors="pt", add_special_tokens=False)
    torch.manual_seed(seed)
    out = sampled_ids(model, tokenizer, enc, max_new_tokens)
    start = enc["input_ids"].shape[1]
    response = out[:, start:]
    with torch.no_grad():
        logp_all = model(out).logits[:, start - 1 : -1].float().log_softmax(-1)
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    logp = logp_all.gather(-1, response.unsqueeze(-1)).squeeze(-1)
    is_eos = (response == tokenizer.eos_token_id).long()
    valid = (is_eos.cumsum(1) - is_eos) == 0  # every token up to and including the first <eos>
    texts = tokenizer.batch_decode(response, skip_special_tokens=True)
    return {"texts": texts, "valid": valid, "logp": logp, "entropy": entropy}


def one_batch(model: Any, tokenizer: Any, rows: list[dict[str, str]], mu: float, max_new: int, seed: int) -> dict:
    """Clip_B's threshold and mask on one sampled batch of ``PROMPTS`` x ``GROUP`` responses."""
    g = torch.Generator().manual_seed(seed)
    picked = [rows[i] for i in torch.randint(len(rows), (PROMPTS,), generator=g).tolist()]
    prompts = [r["prompt"] for r in picked for _ in range(GROUP)]
    answers = [r["answer"] for r in picked for _ in range(GROUP)]
    s = response_stats(model, tokenizer, prompts, max_new, seed)
    rewards = torch.tensor([float(t.strip() == a) for t, a in zip(s["texts"], answers, strict=True)])
    adv = grpo_advantages(rewards, GROUP, scale="group")
    disc = entropy_discriminator(s["logp"], s["entropy"])
    keep = clip_b_mask(disc, adv, s["valid"], mu=mu)
    values = disc[s["valid"]].double()
    masked = s["valid"] & ~keep
    letters = [t[:1] for t in s["texts"]]
    return {
        "threshold": float(values.mean() - mu * values.std(unbiased=False)),
        "std": float(values.std(unbiased=False)),
        "masked_strategy": int(masked[:, 0].sum()),
        "masked_exec": int(masked[:, 1:].sum()),
        "strategy_S": list(zip(letters, disc[:, 0].tolist(), strict=True)),
    }


def measure(experiment: str, base: str, batches: int, mu: float) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = EXPERIMENTS[experiment]
    path = spec["models"] / base
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    rows = [json.loads(line) for line in (spec["data"] / "train.jsonl").read_text().splitlines() if line.strip()]
    max_new = 10 if experiment == "short" else 31  # configs/forking/short.yaml, base.yaml
    each = [one_batch(model, tokenizer, rows, mu, max_new, seed) for seed in range(batches)]
    by_letter: dict[str, list[float]] = {}
    for b in each:
        for letter, value in b["strategy_S"]:
            by_letter.setdefault(letter, []).append(value)
    return {
        "threshold": fmean(b["threshold"] for b in each),
        "std": fmean(b["std"] for b in each),
        "masked_strategy": fmean(b["masked_strategy"] for b in each),
        "masked_exec": fmean(b["masked_exec"] for b in each),
        "strategy_S": {k: (len(v), fmean(v)) for k, v in sorted(by_letter.items()) if k in "ABCD" and k},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", choices=tuple(EXPERIMENTS), default="short")
    p.add_argument("--bases", default=",".join(BASES))
    p.add_argument("--batches", type=int, default=20)
    p.add_argument("--mu", type=float, default=2.5)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    for base in args.bases.split(","):
        r = measure(args.experiment, base, args.batches, args.mu)
        letters = ", ".join(f"{k} {v:+.3f} (n {n})" for k, (n, v) in r["strategy_S"].items())
        print(
            f"{args.experiment} {base}: threshold S < {r['threshold']:+.3f} (batch std {r['std']:.3f}); masked per "
            f"batch: strategy {r['masked_strategy']:.2f}, execution {r['masked_exec']:.2f}; strategy-token S: "
            f"{letters} ({args.batches} batches of {PROMPTS} x {GROUP}, T = 1.0, mu {args.mu})",
            flush=True,
        )


if __name__ == "__main__":
    main()

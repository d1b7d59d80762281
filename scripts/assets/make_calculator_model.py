"""Build the calculator demonstration's base model ``lit_entropy/assets/tiny-qwen2-calculator``.

A tiny Qwen2 (head_dim 64) over the character chat tokenizer (:mod:`lit_entropy.environments.char_chat`) is
supervised on train problems of :mod:`lit_entropy.environments.calculator`, as the embedded default and the
studies' base models were built (teacher forcing, loss on the policy's tokens only). A fraction
``--tool-share`` (0.25) of the supervised trajectories call the tool and copy its result::

    47*86=<tool_call>{"name":"calculate","arguments":{"expression":"47*86"}}</tool_call><eos>
          <tool_response>4042</tool_response>4042<eos>

the others answer directly (``47*86=4042<eos>``), which a 0.3M-parameter model mostly gets wrong. The SFT stops
at the first check (sampled at T = 1, the tool executed for real) where the trajectories that call the tool are
right at least ``--target-tool-acc`` of the time: the model then knows the call but uses it about a quarter of
the time, and reinforcement learning has a tool-use rate and an accuracy to raise.

    python -m scripts.assets.make_calculator_model   # a few minutes on 2 idle cores; deterministic
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

from lit_entropy.environments.calculator import calculate, make_calculator_examples
from lit_entropy.environments.char_chat import build_char_chat_tokenizer
from scripts.assets import sft
from scripts.assets.agent_rollout import play_trajectories, supervised_batch

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "lit_entropy" / "assets" / "tiny-qwen2-calculator"
MAX_CALL_TOKENS = 64  # the call is 57 tokens for two-digit operands
MAX_ANSWER_TOKENS = 8


def tool_call_text(expression: str) -> str:
    """The Hermes call of ``calculate(expression)`` as the base model writes it (compact JSON, no spaces)."""
    return (
        "<tool_call>"
        + json.dumps({"name": "calculate", "arguments": {"expression": expression}}, separators=(",", ":"))
        + "</tool_call>"
    )


def supervised_messages(row: dict[str, str], use_tool: bool) -> list[dict[str, str]]:
    """One supervised trajectory of ``row``: a tool call, its result and the copied answer, or a direct answer."""
    user = {"role": "user", "content": row["prompt"]}
    if not use_tool:
        return [user, {"role": "assistant", "content": row["answer"]}]
    expression = row["prompt"].rstrip("=")
    return [
        user,
        {"role": "assistant", "content": tool_call_text(expression)},
        {"role": "tool", "content": calculate(expression)},
        {"role": "assistant", "content": row["answer"]},
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sft.builder_parser(__doc__.split("\n\n")[0], DEFAULT_OUT)
    p.add_argument("--tool-share", type=float, default=0.25, help="share of supervised trajectories that call the tool")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--hidden-size", type=int, default=128)
    sft.add_sft_arguments(p, max_steps=3000, eval_every=100)
    p.add_argument("--eval-prompts", type=int, default=32)
    p.add_argument("--target-tool-acc", type=float, default=0.6, help="stop once tool trajectories are this right")
    p.add_argument("--final-prompts", type=int, default=256)
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict[str, str]], samples: int, seed: int) -> dict[str, float]:
    """Tool-use rate, accuracy, and accuracy with / without the tool of T = 1 samples (the tool really runs)."""
    trajectories = play_trajectories(
        model,
        tokenizer,
        [r["prompt"] for r in rows],
        samples=samples,
        seed=seed,
        call_tokens=MAX_CALL_TOKENS,
        answer_tokens=MAX_ANSWER_TOKENS,
        tool=calculate,
    )
    used = right = right_tool = 0
    for i, t in enumerate(trajectories):
        ok = t.turns[-1].strip() == rows[i // samples]["answer"]  # exact_match on the last turn, as in training
        used += t.called
        right += ok
        right_tool += ok and t.called
    n = len(trajectories)
    return {
        "tool_use_rate": used / n,
        "accuracy": right / n,
        "tool_accuracy": right_tool / max(used, 1),
        "direct_accuracy": (right - right_tool) / max(n - used, 1),
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = build_char_chat_tokenizer(model_max_length=128)
    model = sft.build_model(tokenizer, args.seed, MAX_CALL_TOKENS, args.num_layers, args.hidden_size)
    train = make_calculator_examples("train", seed=args.seed)
    val = make_calculator_examples("validation", seed=args.seed)
    rng = random.Random(args.seed)

    def next_batch() -> dict[str, torch.Tensor]:
        conversations = [
            supervised_messages(train[rng.randrange(len(train))], rng.random() < args.tool_share)
            for _ in range(args.batch_size)
        ]
        return supervised_batch(conversations, tokenizer)

    fit = sft.supervise(
        model,
        next_batch,
        lambda: evaluate(model, tokenizer, val[: args.eval_prompts], samples=2, seed=args.seed),
        lambda stats: stats["tool_accuracy"] >= args.target_tool_acc,
        lr=args.lr,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
    )
    final = evaluate(model, tokenizer, val[: args.final_prompts], samples=8, seed=args.seed + 1)
    sft.save(model, tokenizer, args.out)
    numbers = {f"val_{k}": round(v, 4) for k, v in final.items()}
    fields = {"val_prompts": args.final_prompts, "samples": 8, **numbers, "args": sft.arguments(args)}
    sft.write_report(args.out, sft.report(fit, model, t0, **fields))


if __name__ == "__main__":
    main()

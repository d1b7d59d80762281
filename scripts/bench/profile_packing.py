"""Where the statistics pass + update spend their time: the transformer (on padding or not) vs the vocabulary pass.

The bench (``python -m scripts.bench.step --stop-rule``) times whole phases; this script splits the work of one
statistics pass + update on the same kind of batch into its components, in one process, one intra-op thread,
CPU seconds (process time: a loaded machine stretches wall time, much less the CPU time of a single thread):

- ``padded``: :func:`~lit_entropy.step.response_forward` with its graph (blockwise head: only response-mask tokens
  go through the vocabulary) + the backward of a per-token loss: the default's statistics pass and update, whose
  single update reuses that forward.
- ``packed``: the same with ``packed=True`` (``model.update.pack_sequences``), one row for the whole batch.
- ``vocabulary``: the blockwise vocabulary pass alone (:func:`~lit_entropy.functional.linear_entropy_stats` on the
  response-mask hidden states) + its backward: the part both paths share, padding-free already.
- ``optimizer``: one AdamW step over every parameter (shared too).

Transformer seconds = path - vocabulary, per batch. The ratio ``(packed + optimizer) / (padded + optimizer)`` (per
batch; medians over the batches are printed) is what packing can save at this shape; it reaches the issue's 0.6x
only when the transformer's padded work dominates.

The batch: ``--rows`` rows, response lengths from the stop rule (``scripts/bench/stop_rule.py``, seed = repeat index,
the bench's draws), prompts of ``--prompt-length`` tokens, random ids; the model is bench_step's realistic Qwen2
(random init, head_dim 64, tied head, ``intermediate = 4 x hidden``)::

    python -m scripts.bench.profile_packing --vocab-size 151936 --hidden-size 256 --num-layers 2 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from lit_entropy.functional.entropy import linear_entropy_stats
from lit_entropy.models.hidden_states import lm_head_params
from lit_entropy.rollout.base import RolloutBatch
from lit_entropy.step.forward import response_forward
from scripts.bench.stop_rule import draw_lengths

__all__ = ["build_model", "main", "measure", "random_rollout"]


def build_model(vocab_size: int, hidden_size: int, num_layers: int) -> torch.nn.Module:
    """bench_step's realistic Qwen2 shape, in memory (sdpa attention, float32)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    heads = hidden_size // 64
    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=4 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2), head_dim=64,
        max_position_embeddings=2048, tie_word_embeddings=True, pad_token_id=0, eos_token_id=1, bos_token_id=2,
    )  # fmt: skip
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def random_rollout(lengths: torch.Tensor, prompt_length: int, vocab_size: int, seed: int) -> RolloutBatch:
    """Rows of ``prompt_length`` prompt tokens and ``lengths[i]`` response tokens (right-padded to the longest)."""
    gen = torch.Generator().manual_seed(seed)
    rows, width = lengths.numel(), int(lengths.max())
    sequences = torch.randint(3, vocab_size, (rows, prompt_length + width), generator=gen)
    response_mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    attention_mask = torch.cat([torch.ones(rows, prompt_length, dtype=torch.long), response_mask.long()], dim=1)
    return RolloutBatch(sequences=sequences, attention_mask=attention_mask, response_mask=response_mask)


def _cpu_seconds(fn: Callable[[], None]) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def measure(model: torch.nn.Module, rollout: RolloutBatch, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """CPU seconds of each component on ``rollout`` (see the module docstring)."""
    mask = rollout.response_mask
    weights = torch.randn(mask.shape).masked_fill(~mask, 0.0)  # stands in for advantages / normaliser

    def path(packed: bool) -> Callable[[], None]:
        def run() -> None:
            out = response_forward(model, rollout, temperature=1.0, packed=packed)
            (out.stats.logprobs * weights).sum().backward()

        return run

    def vocabulary() -> None:
        weight, bias = lm_head_params(model)
        states = torch.randn(int(mask.sum()), weight.shape[1], requires_grad=True)
        stats = linear_entropy_stats(states, weight, rollout.responses[mask], bias=bias, temperature=1.0)
        (stats[0] * weights[mask]).sum().backward()

    out = {}
    for name, fn in (("vocabulary", vocabulary), ("packed", path(True)), ("padded", path(False))):
        optimizer.zero_grad(set_to_none=True)
        out[name] = _cpu_seconds(fn)
    out["optimizer"] = _cpu_seconds(optimizer.step)  # on the padded path's gradients (every parameter has one)
    optimizer.zero_grad(set_to_none=True)
    return out


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Measure ``--repeats`` batches, print the medians, the split and the packed/padded ratio."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vocab-size", type=int, default=151_936)
    p.add_argument("--hidden-size", type=int, default=256, help="multiple of 64 (head_dim 64)")
    p.add_argument("--num-layers", type=int, default=2)
    p.add_argument("--rows", type=int, default=16, help="rows per batch (bench_step: batch size x group size)")
    p.add_argument("--prompt-length", type=int, default=12, help="prompt tokens per row (the arithmetic prompts')")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--repeats", type=int, default=3, help="batches measured (seeds 0..repeats-1) after one warm-up")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    model = build_model(args.vocab_size, args.hidden_size, args.num_layers)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6, foreach=False)
    runs = []
    for seed in range(args.repeats + 1):  # seed 0 twice: the first run warms the allocator and kernels
        lengths = draw_lengths(args.rows, args.max_new_tokens, seed=max(seed - 1, 0))
        rollout = random_rollout(lengths, args.prompt_length, args.vocab_size, seed)
        result = measure(model, rollout, optimizer)
        padded_tokens = args.rows * (args.prompt_length + int(lengths.max()))
        real = int(lengths.sum()) + args.rows * args.prompt_length
        print(f"batch {seed}: {real} real of {padded_tokens} padded positions; " + ", ".join(
            f"{k} {v:.2f} s" for k, v in result.items()), flush=True)  # fmt: skip
        if seed:
            runs.append(result)
    med = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    # medians of per-batch differences and ratios: batches differ in length, and one batch's components share its
    # machine state, so a batch's own difference is less noisy than a difference of medians
    transformer_padded = statistics.median(r["padded"] - r["vocabulary"] for r in runs)
    transformer_packed = statistics.median(r["packed"] - r["vocabulary"] for r in runs)
    ratio = statistics.median((r["packed"] + r["optimizer"]) / (r["padded"] + r["optimizer"]) for r in runs)
    print(
        f"shape: vocab {args.vocab_size}, hidden {args.hidden_size}, {args.num_layers} layers, {args.rows} rows, "
        f"prompt {args.prompt_length}, stop rule up to {args.max_new_tokens}; median CPU s over {args.repeats}:\n"
        f"| component | padded path | packed path |\n|---|---|---|\n"
        f"| transformer forward + backward | {transformer_padded:.2f} | {transformer_packed:.2f} |\n"
        f"| vocabulary pass forward + backward (padding-free) | {med['vocabulary']:.2f} | {med['vocabulary']:.2f} |\n"
        f"| optimizer step | {med['optimizer']:.2f} | {med['optimizer']:.2f} |\n"
        f"| statistics pass + update | {med['padded'] + med['optimizer']:.2f} | {med['packed'] + med['optimizer']:.2f} "
        f"(**{ratio:.2f}x**, median of the per-batch ratios) |"
    )
    return {**med, "ratio": ratio}


if __name__ == "__main__":
    main()

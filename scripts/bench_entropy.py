"""Benchmark chunked ``entropy_stats`` against a naive full-softmax implementation (CPU).

Each (rows, variant) runs in a fresh spawned process so that its peak RSS is its own: the child
allocates the float32 logits ``[rows, vocab]``, records ``VmRSS`` as the baseline, runs the variant
(one warm-up + ``--repeats`` timed calls), then reads ``VmHWM`` (the peak RSS, which cannot be
reset within a process). Peak extra memory = VmHWM - baseline.

Example::

    python scripts/bench_entropy.py --rows 512 2048 --vocab 151936 --repeats 3 --threads 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path


def _proc_status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (e.g. VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _naive(logits, token_ids, backward: bool):
    """Full-tensor reference: log_softmax over everything, then p, H, log p_k, S and E_p[S]."""
    import torch

    logp_all = torch.log_softmax(logits, dim=-1)
    p = logp_all.exp()
    entropy = -(p * logp_all).sum(-1)
    logp = logp_all.gather(-1, token_ids.unsqueeze(-1)).squeeze(-1)
    disc = logp.detach().exp() * (entropy.detach() + logp.detach())
    avg = (entropy.detach() * (p * p).sum(-1) + (p * p * logp_all).sum(-1)).detach()
    if backward:
        (logp.sum() + 0.01 * entropy.sum()).backward()
    return logp, entropy, disc, avg


def _chunked(logits, token_ids, backward: bool, chunk_size: int | None):
    from lit_entropy.functional.entropy import entropy_stats

    out = entropy_stats(logits, token_ids, chunk_size=chunk_size, policy_average=True)
    if backward:
        (out.logprobs.sum() + 0.01 * out.entropy.sum()).backward()
    return out


def _worker(
    rows: int, vocab: int, variant: str, repeats: int, threads: int, backward: bool, chunk_size: int | None, queue
) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    # In place: a temporary here would raise VmHWM above the baseline before the measurement.
    logits = torch.empty(rows, vocab).normal_(generator=gen).mul_(3.0)
    token_ids = torch.randint(0, vocab, (rows,), generator=gen)
    logits.requires_grad_(backward)
    fn = (
        (lambda: _naive(logits, token_ids, backward))
        if variant == "naive"
        else (lambda: _chunked(logits, token_ids, backward, chunk_size))
    )
    base_kib = _proc_status_kib("VmRSS")
    if _proc_status_kib("VmHWM") > base_kib + 4096:
        raise RuntimeError("peak RSS already above the baseline before the run; the measurement would be hidden")
    times = []
    for i in range(repeats + 1):  # the first call is a warm-up (imports, lazy init)
        logits.grad = None
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        del out
        if i > 0:
            times.append(dt)
    logits.grad = None
    queue.put(
        {
            "time_s": statistics.median(times),
            "extra_bytes": (_proc_status_kib("VmHWM") - base_kib) * 1024,
            "logits_bytes": logits.numel() * logits.element_size(),
        }
    )


def _measure(ctx, **kwargs) -> dict:
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, kwargs={**kwargs, "queue": queue})
    proc.start()
    result = queue.get()
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"worker {kwargs} exited with {proc.exitcode}")
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[512, 2048], help="positions N of logits [N, V]")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size V (Qwen2.5: 151936)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for both variants")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: library default)")
    parser.add_argument("--backward", action="store_true", help="also run backward of logp.sum() + 0.01 H.sum()")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1 or args.vocab < 1 or min(args.rows) < 1:
        parser.error("--rows, --vocab, --repeats and --threads must be >= 1")

    ctx = mp.get_context("spawn")
    mode = "forward+backward" if args.backward else "forward"
    print(
        f"entropy_stats(policy_average=True) vs naive full softmax, {mode}, float32, "
        f"V={args.vocab}, threads={args.threads}, repeats={args.repeats} (+1 warm-up), "
        f"chunk_size={args.chunk_size or 'default'}"
    )
    header = (
        f"{'rows':>6} {'logits MB':>10} {'naive s':>9} {'chunked s':>10} {'time ratio':>11} "
        f"{'naive extra MB':>15} {'chunked extra MB':>17} {'chunked extra/logits':>21} "
        f"{'naive extra/logits':>19}"
    )
    print(header)
    for rows in args.rows:
        common = {
            "rows": rows,
            "vocab": args.vocab,
            "repeats": args.repeats,
            "threads": args.threads,
            "backward": args.backward,
            "chunk_size": args.chunk_size,
        }
        naive = _measure(ctx, variant="naive", **common)
        chunked = _measure(ctx, variant="chunked", **common)
        mb = 1024.0**2
        size = chunked["logits_bytes"]
        print(
            f"{rows:>6} {size / mb:>10.1f} {naive['time_s']:>9.3f} {chunked['time_s']:>10.3f} "
            f"{chunked['time_s'] / naive['time_s']:>11.3f} {naive['extra_bytes'] / mb:>15.1f} "
            f"{chunked['extra_bytes'] / mb:>17.1f} {chunked['extra_bytes'] / size:>21.3f} "
            f"{naive['extra_bytes'] / size:>19.3f}"
        )
        # Targets: extra memory <= 0.25x logits (plus the unavoidable logits-sized gradient when
        # --backward), time <= 1.2x naive.
        mem_limit = 0.25 + (1.0 if args.backward else 0.0)
        ok = chunked["extra_bytes"] / size <= mem_limit and chunked["time_s"] / naive["time_s"] <= 1.2
        print(f"{'':>6} targets (extra <= {mem_limit:.2f}x logits, time <= 1.2x naive): {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()

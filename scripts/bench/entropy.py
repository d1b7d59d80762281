"""Benchmark the vocabulary pass: log-prob of the sampled token, entropy and E_p[S] (CPU, float32).

Two modes, each (rows, variant) in a fresh spawned process so that its peak RSS is its own. The child
allocates its inputs, records ``VmRSS`` as the baseline, runs one warm-up call, resets the peak RSS
(``/proc/self/clear_refs``), runs ``--repeats`` timed calls and reads ``VmHWM``. Peak extra memory =
VmHWM - baseline, reported as a fraction of one float32 logits tensor ``[rows, vocab]``.

* Logits mode (default): the logits ``[N, V]`` are the input; ``entropy_stats`` (chunked) against a
  naive ``log_softmax`` over everything.
* Head mode (``--head``; ``--realistic`` = ``--head --rows 2048 --vocab 151936 --hidden 256 --backward``,
  Qwen2.5's vocabulary): the inputs are hidden states ``[N, H]`` and an LM-head weight ``[V, H]``, and the
  variants are (a) ``naive``: full logits, ``log_softmax`` and entropy over everything; (b) ``chunked``:
  full logits ``h @ W.T``, then today's chunked ``entropy_stats``; (c) ``blockwise``: ``linear_entropy_stats``
  (logits never materialised; the backward recomputes each logits block); (c') ``blockwise_loss``:
  ``linear_entropy_loss`` with the same loss (the gradient is formed in the forward, no recompute: what a
  separate update forward runs); (d) ``trl``: full logits, then TRL's ``selective_log_softmax_and_entropy``
  (chunked log-softmax / entropy; skipped with a message when ``trl`` is not importable, e.g. run with
  ``PYTHONPATH=<dir with trl and accelerate>``; TRL computes no E_p[S]); (e) ``matmuls``: only the head-sized
  matmuls that a path keeping the logits must do (logits; with ``--backward`` also the hidden-state and weight
  gradients), no softmax work: the time floor. A path that never keeps the logits recomputes them in the
  backward, so its floor is 4/3 of this one (printed). With ``--backward`` the loss
  ``sum log p_k + 0.01 sum H`` is differentiated w.r.t. the hidden states AND the weight; the column
  "excl. W grad" subtracts one weight-gradient-sized tensor ``[V, H]`` float32 that every variant needs.

Time is the median wall time of the repeats; "cpu s" is the median process CPU time (robust to other
processes on a shared machine).

Examples::

    python -m scripts.bench.entropy --rows 512 2048 --vocab 151936 --repeats 3 --threads 1
    python -m scripts.bench.entropy --realistic --repeats 2 --threads 1
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time

HEAD_VARIANTS = ("naive", "chunked", "blockwise", "blockwise_loss", "trl", "matmuls")
LOSS_ENTROPY_WEIGHT = 0.01


def _proc_status_kib(field: str) -> int:
    """A ``kB`` field of /proc/self/status (e.g. VmRSS, VmHWM) in KiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not found in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where not permitted."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


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
        (logp.sum() + LOSS_ENTROPY_WEIGHT * entropy.sum()).backward()
    return logp, entropy, disc, avg


def _chunked(logits, token_ids, backward: bool, chunk_size: int | None):
    from lit_entropy.functional.entropy import entropy_stats

    out = entropy_stats(logits, token_ids, chunk_size=chunk_size, policy_average=True)
    if backward:
        (out.logprobs.sum() + LOSS_ENTROPY_WEIGHT * out.entropy.sum()).backward()
    return out


def _head_variant(variant: str, hidden, weight, token_ids, backward: bool, chunk_size, vocab_chunk_size):
    """One call of a head-mode variant; returns a callable."""
    if variant == "naive":
        return lambda: _naive(hidden @ weight.T, token_ids, backward)
    if variant == "chunked":
        return lambda: _chunked(hidden @ weight.T, token_ids, backward, chunk_size)
    if variant == "blockwise":
        from lit_entropy.functional.entropy import linear_entropy_stats

        def blockwise():
            out = linear_entropy_stats(
                hidden,
                weight,
                token_ids,
                policy_average=True,
                chunk_size=chunk_size,
                vocab_chunk_size=vocab_chunk_size,
            )
            if backward:
                (out.logprobs.sum() + LOSS_ENTROPY_WEIGHT * out.entropy.sum()).backward()
            return out

        return blockwise
    if variant == "blockwise_loss":
        from lit_entropy.functional.entropy import linear_entropy_loss

        def blockwise_loss():
            loss, out = linear_entropy_loss(
                hidden,
                weight,
                token_ids,
                lambda logp, entropy: logp.sum() + LOSS_ENTROPY_WEIGHT * entropy.sum(),
                policy_average=True,
                chunk_size=chunk_size,
                vocab_chunk_size=vocab_chunk_size,
            )
            if backward:
                loss.backward()
            return out

        return blockwise_loss
    if variant == "matmuls":

        def matmuls():
            z = hidden.detach() @ weight.detach().T  # stands in for the logits and for their gradient
            return (z @ weight.detach(), z.T @ hidden.detach()) if backward else z

        return matmuls
    if variant == "trl":
        from trl.trainer.utils import selective_log_softmax_and_entropy

        def trl():
            logp, entropy = selective_log_softmax_and_entropy(hidden @ weight.T, token_ids)
            if backward:
                (logp.sum() + LOSS_ENTROPY_WEIGHT * entropy.sum()).backward()
            return logp, entropy

        return trl
    raise ValueError(f"unknown variant {variant!r}")


def _worker(
    rows: int,
    vocab: int,
    hidden_size: int | None,
    variant: str,
    repeats: int,
    threads: int,
    backward: bool,
    chunk_size: int | None,
    vocab_chunk_size: int | None,
    queue,
) -> None:
    import torch

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    token_ids = torch.randint(0, vocab, (rows,), generator=gen)
    # In place: a temporary here would raise VmHWM above the baseline before the measurement.
    if hidden_size is None:
        logits = torch.empty(rows, vocab).normal_(generator=gen).mul_(3.0)
        logits.requires_grad_(backward)
        leaves = [logits]
        fn = (
            (lambda: _naive(logits, token_ids, backward))
            if variant == "naive"
            else (lambda: _chunked(logits, token_ids, backward, chunk_size))
        )
    else:
        # Logit spread ~3 (std), like the logits mode: ||h|| ~ sqrt(H), rows of W ~ 3 / sqrt(H).
        hidden = torch.empty(rows, hidden_size).normal_(generator=gen)
        weight = torch.empty(vocab, hidden_size).normal_(generator=gen).mul_(3.0 / hidden_size**0.5)
        leaves = [hidden.requires_grad_(backward), weight.requires_grad_(backward)]
        try:
            fn = _head_variant(variant, hidden, weight, token_ids, backward, chunk_size, vocab_chunk_size)
        except ImportError as err:
            queue.put({"skipped": f"{type(err).__name__}: {err}"})
            return
    base_kib = _proc_status_kib("VmRSS")
    times, cpu_times = [], []
    for i in range(repeats + 1):  # the first call is a warm-up (imports, lazy init)
        for t in leaves:
            t.grad = None
        if i == 1:
            # Where the reset is not permitted the peak includes the warm-up, which allocates the same.
            _reset_peak_rss()
        t0, c0 = time.perf_counter(), time.process_time()
        out = fn()
        dt, dc = time.perf_counter() - t0, time.process_time() - c0
        del out
        if i > 0:
            times.append(dt)
            cpu_times.append(dc)
    queue.put(
        {
            "time_s": statistics.median(times),
            "cpu_s": statistics.median(cpu_times),
            "extra_bytes": (_proc_status_kib("VmHWM") - base_kib) * 1024,
            "logits_bytes": rows * vocab * 4,
            "weight_grad_bytes": (vocab * hidden_size * 4) if (hidden_size and backward) else 0,
        }
    )


def _measure(ctx, **kwargs) -> dict:
    import queue as queue_module

    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, kwargs={**kwargs, "queue": queue})
    proc.start()
    while True:  # a worker that dies before reporting must not hang the benchmark
        try:
            result = queue.get(timeout=1.0)
            break
        except queue_module.Empty:
            if not proc.is_alive() and queue.empty():
                raise RuntimeError(f"worker {kwargs} died with exit code {proc.exitcode}") from None
    proc.join()
    if proc.exitcode != 0:
        raise RuntimeError(f"worker {kwargs} exited with {proc.exitcode}")
    return result


def _logits_mode(args, ctx) -> None:
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
            "hidden_size": None,
            "repeats": args.repeats,
            "threads": args.threads,
            "backward": args.backward,
            "chunk_size": args.chunk_size,
            "vocab_chunk_size": None,
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


def _head_mode(args, ctx) -> None:
    mode = "forward+backward (grads to hidden and weight)" if args.backward else "forward"
    print(
        f"vocabulary pass from hidden states, E_p[S] on, {mode}, float32, V={args.vocab}, H={args.hidden}, "
        f"threads={args.threads}, repeats={args.repeats} (+1 warm-up), chunk_size={args.chunk_size or 'default'}, "
        f"vocab_chunk_size={args.vocab_chunk_size or 'default'}"
    )
    mb = 1024.0**2
    for rows in args.rows:
        results = {}
        for variant in args.variants:
            results[variant] = _measure(
                ctx,
                rows=rows,
                vocab=args.vocab,
                hidden_size=args.hidden,
                variant=variant,
                repeats=args.repeats,
                threads=args.threads,
                backward=args.backward,
                chunk_size=args.chunk_size,
                vocab_chunk_size=args.vocab_chunk_size,
            )
        measured = {k: v for k, v in results.items() if "skipped" not in v}
        size = rows * args.vocab * 4
        ref = measured.get("chunked")
        print(f"rows={rows}: one float32 logits tensor = {size / mb:.1f} MB")
        print(
            f"{'variant':>14} {'wall s':>8} {'cpu s':>8} {'wall/chunked':>13} {'cpu/chunked':>12} "
            f"{'extra MB':>9} {'extra/logits':>13} {'excl. W grad/logits':>20}"
        )
        for variant, res in results.items():
            if "skipped" in res:
                print(f"{variant:>14} skipped ({res['skipped']})")
                continue
            rel_w = f"{res['time_s'] / ref['time_s']:.3f}" if ref else "-"
            rel_c = f"{res['cpu_s'] / ref['cpu_s']:.3f}" if ref else "-"
            extra = res["extra_bytes"]
            print(
                f"{variant:>14} {res['time_s']:>8.2f} {res['cpu_s']:>8.2f} {rel_w:>13} {rel_c:>12} "
                f"{extra / mb:>9.1f} {extra / size:>13.3f} {(extra - res['weight_grad_bytes']) / size:>20.3f}"
            )
        floor = measured.get("matmuls")
        if floor and args.backward:
            print(
                f"matmul floor (cpu s): {floor['cpu_s']:.2f} for the 3 matmuls of a path that keeps the logits, "
                f"{4 / 3 * floor['cpu_s']:.2f} for the 4 of one that recomputes them"
                + (f" ({4 / 3 * floor['cpu_s'] / ref['cpu_s']:.3f}x chunked)" if ref else "")
            )
        for name in ("blockwise", "blockwise_loss"):
            blockwise = measured.get(name)
            if not (blockwise and ref and "skipped" not in blockwise):
                continue
            mem = (blockwise["extra_bytes"] - blockwise["weight_grad_bytes"]) / size
            speed = blockwise["cpu_s"] / ref["cpu_s"]
            ok = mem <= 0.1 and speed <= 1.0
            print(
                f"targets ({name}: extra excl. W grad <= 0.10x logits, cpu time <= 1.0x chunked): "
                f"{mem:.3f}x, {speed:.3f}x -> {'met' if ok else 'MISSED'}"
            )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=None, help="positions N (default 512 2048)")
    parser.add_argument("--vocab", type=int, default=151936, help="vocabulary size V (Qwen2.5: 151936)")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls per variant (median reported)")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads for every variant")
    parser.add_argument("--chunk-size", type=int, default=None, help="rows per chunk (default: library default)")
    parser.add_argument("--vocab-chunk-size", type=int, default=None, help="blockwise: vocabulary entries per block")
    parser.add_argument("--backward", action="store_true", help="also run backward of logp.sum() + 0.01 H.sum()")
    parser.add_argument("--head", action="store_true", help="inputs are hidden states [N, H] and a head [V, H]")
    parser.add_argument("--hidden", type=int, default=256, help="head mode: hidden size H")
    parser.add_argument(
        "--variants", nargs="+", default=list(HEAD_VARIANTS), choices=HEAD_VARIANTS, help="head mode: variants to run"
    )
    parser.add_argument(
        "--realistic",
        action="store_true",
        help="Qwen2.5-sized head pass: --head --rows 2048 --vocab 151936 --hidden 256 --backward",
    )
    args = parser.parse_args(argv)
    if args.realistic:
        args.head, args.backward = True, True
        args.rows = args.rows or [2048]
    args.rows = args.rows or [512, 2048]
    if args.repeats < 1 or args.threads < 1 or args.vocab < 1 or min(args.rows) < 1 or args.hidden < 1:
        parser.error("--rows, --vocab, --hidden, --repeats and --threads must be >= 1")

    ctx = mp.get_context("spawn")
    if args.head:
        _head_mode(args, ctx)
    else:
        _logits_mode(args, ctx)


if __name__ == "__main__":
    main()

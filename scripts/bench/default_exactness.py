"""Is the embedded default unchanged between two commits? Train its first steps at both and compare every scalar.

Each revision is exported with ``git archive`` into a temporary directory and trained there in its own process
(``PYTHONPATH`` = that tree, one intra-op thread): ``lit-entropy fit --config configs/grpo_tiny.yaml`` (the
revision's own config, same seed) for ``--steps`` optimizer steps, without checkpoints or validation. Then every
training scalar (``train/*``) that both runs logged is compared step by step: the TensorBoard values (float32) must
be equal bit for bit. Tags only one revision logs (a dashboard change) are listed, not compared. The final weights are
compared too: each run exports its policy at the end of training (``model.logging.export_on_train_end``, on by
default) and :func:`weights_hash` is sha256 over its tensors in key order; the two hashes must be equal.

Example (the commit before issue 26's first commit against the current tree)::

    python -m scripts.bench.default_exactness --base 111fd2c~1 --head HEAD --steps 10

Exit status 0 when every shared scalar and the final weights are identical, 1 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from scripts.docs.run_summary import read_scalars

REPO = Path(__file__).resolve().parents[2]

__all__ = ["compare_scalars", "export_revision", "main", "train_default", "weights_hash"]

Scalars = dict[str, list[tuple[int, float]]]


def export_revision(revision: str, out: Path) -> str:
    """Extract ``revision``'s tree into ``out``; returns its full commit hash."""
    commit = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{revision}^{{commit}}"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], capture_output=True, check=True).stdout
    out.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(out, filter="data")
    return commit


def train_default(tree: Path, logs: Path, steps: int) -> Path:
    """Train ``tree``'s ``configs/grpo_tiny.yaml`` for ``steps`` optimizer steps; returns the run's log directory."""
    cmd = [sys.executable, "-c", "import sys; from lit_entropy.cli import main; sys.exit(main())", "fit"]
    cmd += ["--config", str(tree / "configs" / "grpo_tiny.yaml"), "--trainer.max_steps", str(steps)]
    cmd += ["--trainer.enable_checkpointing", "false", "--trainer.limit_val_batches", "0"]
    cmd += ["--trainer.enable_progress_bar", "false", "--trainer.logger.init_args.save_dir", str(logs)]
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    done = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"training at {tree} failed:\n{done.stderr[-4000:]}")
    runs = sorted(logs.glob("*/version_*"))
    if len(runs) != 1:
        raise RuntimeError(f"expected one run under {logs}, found {runs}")
    return runs[0]


def weights_hash(export_dir: Path) -> str:
    """sha256 over the tensors of an exported ``save_pretrained`` directory, in key order.

    Each tensor contributes its name, dtype, shape and raw bytes, so a renamed, recast or reshaped tensor changes
    the hash as surely as a changed value. Reads every ``*.safetensors`` shard in the directory.
    """
    import torch
    from safetensors.torch import load_file

    shards = sorted(export_dir.glob("*.safetensors"))
    if not shards:
        raise FileNotFoundError(f"no *.safetensors under {export_dir}: was the policy exported?")
    tensors = {}
    for shard in shards:
        tensors.update(load_file(str(shard)))
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # bytes of any dtype (bf16 too)
    return digest.hexdigest()


def compare_scalars(base: Scalars, head: Scalars, prefix: str = "train/") -> dict[str, list[str]]:
    """Tags (starting with ``prefix``) that differ, that are equal, and that only one side logged.

    Two tags are equal when they were logged at the same steps with identical values (``==``, so bit for bit
    for the float32 values TensorBoard stores; NaN never equals).
    """
    base = {tag: points for tag, points in base.items() if tag.startswith(prefix)}
    head = {tag: points for tag, points in head.items() if tag.startswith(prefix)}
    shared = sorted(set(base) & set(head))
    differ = [tag for tag in shared if base[tag] != head[tag]]
    return {
        "equal": [tag for tag in shared if tag not in differ],
        "differ": differ,
        "base_only": sorted(set(base) - set(head)),
        "head_only": sorted(set(head) - set(base)),
    }


def main(argv: list[str] | None = None) -> int:
    """Train the default at both revisions, print the comparison, return the exit status."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--base", required=True, help="the earlier revision (e.g. the commit before a change landed)")
    p.add_argument("--head", default="HEAD", help="the later revision")
    p.add_argument("--steps", type=int, default=10, help="optimizer steps to train at each revision")
    args = p.parse_args(argv)
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1, got {args.steps}")
    scalars, commits, hashes = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for side in ("base", "head"):
            tree = Path(tmp) / side / "tree"
            commits[side] = export_revision(getattr(args, side), tree)
            run = train_default(tree, Path(tmp) / side / "logs", args.steps)
            scalars[side], hashes[side] = read_scalars(run), weights_hash(run / "hf_model")
    result = compare_scalars(scalars["base"], scalars["head"])
    points = sum(len(scalars["base"][tag]) for tag in result["equal"] + result["differ"])
    print(f"base {commits['base'][:10]} ({args.base}), head {commits['head'][:10]} ({args.head}), {args.steps} steps")
    print(f"{len(result['equal'])} train/* tags identical, {len(result['differ'])} differ ({points} values compared)")
    print(f"identical: {', '.join(result['equal'])}")
    for tag in result["differ"]:
        pairs = [(a, b) for a, b in zip(scalars["base"][tag], scalars["head"][tag], strict=False) if a != b]
        first = f"base {pairs[0][0]} head {pairs[0][1]}" if pairs else "logged at other steps"
        print(f"  differs: {tag}: first (step, value) {first}")
    for side in ("base_only", "head_only"):
        if result[side]:
            print(f"logged by {side.replace('_only', '')} only (not compared): {', '.join(result[side])}")
    same = hashes["base"] == hashes["head"]
    print(f"final weights sha256: base {hashes['base']}, head {hashes['head']} ({'identical' if same else 'DIFFER'})")
    return 1 if result["differ"] or not same else 0


if __name__ == "__main__":
    sys.exit(main())

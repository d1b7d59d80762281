"""The forking study's fixed design (decided before any run): methods and their configs, base models, seeds,
steps, evaluation temperatures and k's, the primary endpoint's K and T, bootstrap draws, and the run grid.

``run.py`` (runs) and ``analysis.py`` (tables) both read it from here, so neither imports
the other's module to learn the design.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

__all__ = [
    "BOOTSTRAP",
    "EVAL_EVERY",
    "FORK_BASES",
    "KS",
    "METHODS",
    "NEUTRAL_BASE",
    "NEUTRAL_METHODS",
    "PRIMARY_K",
    "PRIMARY_T",
    "PRIORITY_METHODS",
    "SEEDS",
    "STEPS",
    "TEMPERATURES",
    "Run",
    "full_grid",
    "grid",
]

#: Method name -> overlay config on top of ``configs/forking/base.yaml``.
METHODS = {
    "grpo": "grpo.yaml",
    "clip_b": "clip_b.yaml",
    "random_mask": "random_mask.yaml",
    "clip_v": "clip_v.yaml",
    "clip_v_rescaled": "clip_v_rescaled.yaml",
    "entropy_bonus": "entropy_bonus.yaml",
    "clip_higher": "clip_higher.yaml",
}
PRIORITY_METHODS = ("grpo", "clip_b", "random_mask")
FORK_BASES = ("fork-s0", "fork-s1")
NEUTRAL_BASE = "chain"
NEUTRAL_METHODS = ("grpo", "clip_b", "random_mask", "clip_v_rescaled", "entropy_bonus", "clip_higher")
SEEDS = (0, 1, 2, 3, 4)
STEPS = 80
EVAL_EVERY = 10
TEMPERATURES = (1.0, 0.7)
KS = (1, 2, 4, 8, 16, 32, 64, 256)  # pass@k reported; 256 matters for the rare classes C and D
PRIMARY_K = 64
PRIMARY_T = 1.0
BOOTSTRAP = 2000


@dataclass(frozen=True)
class Run:
    task: str  # "forking" or "chain"
    base: str
    method: str
    seed: int
    steps: int

    @property
    def name(self) -> str:
        return f"{self.task}__{self.base}__{self.method}__s{self.seed}"


def grid(args: argparse.Namespace) -> list[Run]:
    """Runs of ``--grid`` (priority / full / none) narrowed by ``--methods``, ``--bases``, ``--seeds``; ``--smoke``
    gives a tiny pipeline-check grid. ``args`` needs the attributes ``smoke``, ``grid``, ``methods``, ``bases``
    and ``seeds`` (``forking_study.parse_args``)."""
    steps = 2 if args.smoke else STEPS
    if args.smoke:
        runs = [Run("forking", FORK_BASES[0], m, 0, steps) for m in ("grpo", "clip_b", "random_mask")]
        # The neutral task on a forking base model (same tokenizer): tests the pipeline without the chain model.
        return runs + [Run("chain", FORK_BASES[0], "grpo", 0, steps)]
    if args.grid == "none":
        return []
    methods = PRIORITY_METHODS if args.grid == "priority" else tuple(METHODS)
    if args.methods:
        methods = tuple(m for m in args.methods.split(",") if m)
        unknown = sorted(set(methods) - set(METHODS))
        if unknown:
            raise ValueError(f"--methods has unknown methods {unknown}; choose from {sorted(METHODS)}")
    bases = tuple(args.bases.split(",")) if args.bases else FORK_BASES
    seeds = tuple(int(s) for s in args.seeds.split(",")) if args.seeds else SEEDS
    # Seed-major order: an interrupted study has every method at the first seeds rather than some methods only.
    runs = [Run("forking", b, m, s, steps) for s in seeds for b in bases if b != NEUTRAL_BASE for m in methods]
    if NEUTRAL_BASE in bases or (args.grid == "full" and not args.bases):
        runs += [Run("chain", NEUTRAL_BASE, m, s, steps) for s in seeds for m in NEUTRAL_METHODS if m in methods]
    return runs


def full_grid() -> list[Run]:
    """Every run of the full design (all methods, bases and seeds, and the neutral task)."""
    return grid(argparse.Namespace(smoke=False, grid="full", methods=None, bases=None, seeds=None))

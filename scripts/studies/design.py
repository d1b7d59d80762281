"""The vocabulary of every pre-registered study design: the arms' labels and what one experiment fixes.

A study's ``design.py`` (``scripts/studies/sod/design.py``) lists its experiments as :class:`Experiment` values, as
each ``PREREGISTRATION.md`` fixes them; the runner, the analysis and the report read the arms, seeds, bases,
comparisons and rule from there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scripts.studies.analysis import DELTA

__all__ = ["DELTA", "LABELS", "Experiment"]

#: Arm -> label in tables and the README blocks, in table order.
LABELS = {
    "grpo": "GRPO",
    "clip_b": "Clip_B mu 2.5",
    "clip_b_mu2": "Clip_B mu 2.0",
    "clip_b_mu3": "Clip_B mu 3.0",
    "replay_mask": "random mask, Clip_B's per-step count replayed",
    "replay_role": "random mask, count replayed per token role",
    "grpo_null": "GRPO, other data order (null)",
    "clip_v": "Clip_V mu 8.5, cap 1e-4",
    "clip_v_rescaled": "Clip_V mu 8.5, cap rescaled (0.072)",
    "clip_cov": "Clip-Cov (ratio 0.02)",
    "kl_cov": "KL-Cov (ratio 0.02, 4 mini-batches)",
    "grpo_mb4": "GRPO, 4 mini-batches",
    "high_entropy": "80/20 (rho 0.2)",
    "adaptive_entropy": "adaptive entropy bonus",
    "stare": "STARE",
    "entrocraft": "Entrocraft (advantage)",
    "s2t": "STAPO's S2T",
    "advantage_reweighting": "advantage reweighting",
    "unlikeliness": "unlikeliness reward",
    "repo_r": "REPO-R",
}


@dataclass(frozen=True)
class Experiment:
    """One pre-registered experiment: its arms, seeds, base models, comparisons and verdict rule.

    Attributes:
        directory: results directory under ``scripts/forking/experiments/``.
        arms: arm -> method overlay in ``configs/forking/`` (stacked on the study's own overlays, e.g.
            ``base.yaml`` + ``sod.yaml``).
        first: arms run seed by seed before the others; comparisons among them use the seeds where all of them
            finished, any other comparison the seeds where both of its arms finished.
        comparisons: (treated, control) pairs judged by the rule, in the pre-registered order.
        marker: README block marker (``<!-- marker:begin -->``).
        seeds: RL seeds (each sets the sampling and the data order).
        bases: base model -> its directory under ``scripts/forking/experiments/``; the unit is then a (base,
            seed) pair and a run is named ``<base>__<arm>__s<seed>``. Empty: the task's one base model
            (the sum-or-difference task's ``sod/model``), units are seeds and runs are named ``<arm>__s<seed>``.
        descriptive: (treated, control) pairs shown pooled without a verdict or correction.
        secondary: a further family judged on pass@64 with its own Holm correction (F: each method - Clip_B).
        per_base_verdicts: judge the comparisons per base as a corrected family (E); False: per-base differences
            are descriptive only (F: 6 units per base, no test there could pass Holm over 12).
        rule: ``"c"``: C's verdict rule (95 % t interval, raw sign-flip p, "none" also when the interval
            excludes 0 below the floor). ``"holm"``: issue 39's rule (Holm-adjusted p and Bonferroni intervals
            over each family of comparisons, "none" only inside the floor, "small, consistent" otherwise).
    """

    directory: str
    arms: dict[str, str]
    first: tuple[str, ...]
    comparisons: tuple[tuple[str, str], ...]
    marker: str
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7)
    bases: dict[str, str] = field(default_factory=dict)
    rule: str = "c"
    descriptive: tuple[tuple[str, str], ...] = ()
    secondary: tuple[tuple[str, str], ...] = ()
    per_base_verdicts: bool = True

    @property
    def planned_runs(self) -> int:
        return len(self.arms) * len(self.seeds) * max(len(self.bases), 1)

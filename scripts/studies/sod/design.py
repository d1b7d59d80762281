"""The design of the experiments on the sum-or-difference task, as each ``PREREGISTRATION.md`` fixes it.

``run.py`` runs them, ``analysis.py`` judges them and ``report.py``
formats them; all three read the arms, run order, comparisons and labels from here (so the report does not
import the analysis that imports it). Every experiment shares the task's base model and data
(``scripts/forking/experiments/sod/{model,data}``); each has its own results directory and README block.

* ``sod`` (issue 24, experiment C): ``experiments/sod/PREREGISTRATION.md``.
* ``sod_clipv`` (amendment: the Clip_V arm C dropped): ``experiments/sod_clipv/PREREGISTRATION.md``.
* ``sod_robust`` (issue 39, experiment E: three base models, Clip_B at mu 2.0 / 2.5 / 3.0, Holm over the three mu):
  ``experiments/sod_robust/PREREGISTRATION.md``. Its units are (base, seed) pairs; run names carry the base.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scripts.studies.analysis import DELTA  # the effect-size floor of the pre-registered rules

__all__ = ["DELTA", "EXPERIMENTS", "LABELS", "Experiment"]

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
}


@dataclass(frozen=True)
class Experiment:
    """One pre-registered experiment on the sum-or-difference task.

    Attributes:
        directory: results directory under ``scripts/forking/experiments/``.
        arms: arm -> method overlay in ``configs/forking/`` (stacked on ``base.yaml`` + ``sod.yaml``).
        first: arms run seed by seed before the others; comparisons among them use the seeds where all of them
            finished, any other comparison the seeds where both of its arms finished.
        comparisons: (treated, control) pairs judged by the rule, in the pre-registered order.
        marker: README block marker (``<!-- marker:begin -->``).
        seeds: RL seeds (each sets the sampling and the data order).
        bases: base model -> its directory under ``scripts/forking/experiments/``; the unit is then a (base,
            seed) pair and a run is named ``<base>__<arm>__s<seed>``. Empty: the task's one base model
            (``sod/model``), units are seeds and runs are named ``<arm>__s<seed>``.
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

    @property
    def planned_runs(self) -> int:
        return len(self.arms) * len(self.seeds) * max(len(self.bases), 1)


EXPERIMENTS = {
    "sod": Experiment(
        directory="sod",
        arms={
            "grpo": "grpo.yaml",
            "clip_b": "clip_b.yaml",
            "replay_mask": "grpo.yaml",
            "replay_role": "grpo.yaml",
            "grpo_null": "grpo.yaml",
        },
        first=("grpo", "clip_b", "replay_mask"),
        comparisons=(
            ("clip_b", "grpo"),
            ("replay_mask", "grpo"),
            ("clip_b", "replay_mask"),
            ("replay_role", "grpo"),
            ("clip_b", "replay_role"),
            ("grpo_null", "grpo"),
        ),
        marker="sod-results",
    ),
    "sod_clipv": Experiment(
        directory="sod_clipv",
        arms={
            "grpo": "grpo.yaml",
            "clip_v": "clip_v.yaml",
            "clip_v_rescaled": "clip_v_sod.yaml",
            "clip_b": "clip_b.yaml",
        },
        first=("grpo", "clip_v", "clip_v_rescaled"),
        comparisons=(
            ("clip_v", "grpo"),
            ("clip_v_rescaled", "grpo"),
            ("clip_b", "grpo"),
            ("clip_v", "clip_b"),
            ("clip_v_rescaled", "clip_b"),
        ),
        marker="sod-clipv-results",
    ),
    "sod_robust": Experiment(
        directory="sod_robust",
        arms={
            "grpo": "grpo.yaml",
            "clip_b": "clip_b.yaml",
            "clip_b_mu2": "clip_b_mu2.yaml",
            "clip_b_mu3": "clip_b_mu3.yaml",
        },
        first=("grpo", "clip_b", "clip_b_mu2", "clip_b_mu3"),
        # The primary family (Holm over the three mu), in mu order.
        comparisons=(("clip_b_mu2", "grpo"), ("clip_b", "grpo"), ("clip_b_mu3", "grpo")),
        marker="sod-robust-results",
        bases={"sod-s0": "sod/model", "sod-s1": "sod_robust/models/sod-s1", "sod-s2": "sod_robust/models/sod-s2"},
        rule="holm",
    ),
}

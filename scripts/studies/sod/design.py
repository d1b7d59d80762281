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

from scripts.studies.design import DELTA, LABELS, Experiment

__all__ = ["DELTA", "EXPERIMENTS", "LABELS", "Experiment"]

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

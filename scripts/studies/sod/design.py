"""The design of the experiments on the sum-or-difference task, as each ``PREREGISTRATION.md`` fixes it.

``run.py`` runs them, ``analysis.py`` judges them and ``report.py``
formats them; all three read the arms, run order, comparisons and labels from here (so the report does not
import the analysis that imports it). Every experiment shares the task's base model and data
(``scripts/forking/experiments/sod/{model,data}``); each has its own results directory and README block.

* ``sod`` (issue 24, experiment C): ``experiments/sod/PREREGISTRATION.md``.
* ``sod_clipv`` (amendment: the Clip_V arm C dropped): ``experiments/sod_clipv/PREREGISTRATION.md``.
* ``sod_robust`` (issue 39, experiment E: three base models, Clip_B at mu 2.0 / 2.5 / 3.0, Holm over the three mu):
  ``experiments/sod_robust/PREREGISTRATION.md``. Its units are (base, seed) pairs; run names carry the base.
* ``sod_methods`` (issue 39, experiment F: fourteen entropy methods at their papers' defaults on two base models,
  Holm over the twelve comparisons with GRPO): ``experiments/sod_methods/PREREGISTRATION.md``.
"""

from __future__ import annotations

from scripts.studies.design import DELTA, LABELS, Experiment

__all__ = ["DELTA", "EXPERIMENTS", "F_METHODS", "LABELS", "Experiment"]

#: Experiment F's methods other than GRPO and its control, in the pre-registration's order (its primary family).
F_METHODS = (
    "clip_b",
    "clip_v_rescaled",
    "clip_cov",
    "high_entropy",
    "adaptive_entropy",
    "stare",
    "entrocraft",
    "s2t",
    "advantage_reweighting",
    "unlikeliness",
    "repo_r",
)

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
        descriptive=(("clip_b_mu2", "clip_b"), ("clip_b_mu3", "clip_b")),  # each other mu against C's 2.5
    ),
}
#: Experiment F's arms and overlays in the pre-registration's table order (GRPO, Clip_B and the rescaled Clip_V reuse
#: C's and the amendment's overlays).
F_ARMS = {
    "grpo": "grpo.yaml",
    "clip_b": "clip_b.yaml",
    "clip_v_rescaled": "clip_v_sod.yaml",
    "clip_cov": "f_clip_cov.yaml",
    "kl_cov": "f_kl_cov.yaml",
    "grpo_mb4": "f_grpo_mb4.yaml",
    "high_entropy": "f_high_entropy.yaml",
    "adaptive_entropy": "f_adaptive_entropy.yaml",
    "stare": "f_stare.yaml",
    "entrocraft": "f_entrocraft.yaml",
    "s2t": "f_s2t.yaml",
    "advantage_reweighting": "f_advantage_reweighting.yaml",
    "unlikeliness": "f_unlikeliness.yaml",
    "repo_r": "f_repo_r.yaml",
}
EXPERIMENTS["sod_methods"] = Experiment(
    directory="sod_methods",
    arms=F_ARMS,
    # Every arm unit by unit: a unit's 14 arms run consecutively, so a study cut short has whole units.
    first=tuple(F_ARMS),
    # Primary (m = 12): each method - GRPO, KL-Cov against its own recipe's GRPO (4 mini-batches).
    comparisons=(*((arm, "grpo") for arm in F_METHODS), ("kl_cov", "grpo_mb4")),
    marker="sod-methods-results",
    seeds=(0, 1, 2, 3, 4, 5),
    bases={"sod-s0": "sod/model", "sod-s1": "sod_robust/models/sod-s1"},
    rule="holm",
    # Secondary (m = 11): each other method - Clip_B (KL-Cov crosses recipes).
    secondary=tuple((arm, "clip_b") for arm in (*F_METHODS[1:], "kl_cov")),
    per_base_verdicts=False,
    descriptive=(("grpo_mb4", "grpo"),),  # what 4 updates per rollout batch do by themselves
)

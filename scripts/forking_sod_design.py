"""Names the sum-or-difference study's analysis and report share (``PREREGISTRATION.md``): the effect-size floor
of the verdict rule and the arms' labels.

Both ``forking_sod_analysis.py`` and ``forking_sod_report.py`` read them from here, so the report does not import
the analysis that imports it.
"""

from __future__ import annotations

__all__ = ["DELTA", "LABELS"]

#: Effect-size floor of the pre-registered verdict rule (pass@64 / avg@64 points, as fractions).
DELTA = 0.02
#: Arm -> label in tables and the README block, in the pre-registered order.
LABELS = {
    "grpo": "GRPO",
    "clip_b": "Clip_B mu 2.5",
    "replay_mask": "random mask, Clip_B's per-step count replayed",
    "replay_role": "random mask, count replayed per token role",
    "grpo_null": "GRPO, other data order (null)",
}

"""The first screen of the dashboard: a few key curves that TensorBoard shows before everything else.

Time Series sorts its card groups by tag name and opens the first two; ``overview/`` sorts before
``perf/``, ``train/`` and ``val/`` (Lightning's ``epoch`` staircase is not logged, see
:mod:`lit_entropy.reporting.steps`), and the numbered card names keep the cards in reading order:
reward, validation Avg@K and Pass@K, entropy, response length, clip and masking fractions, tokens per
second. Each card copies one tag logged in full elsewhere (:func:`overview_copies`), except the masked
fraction, which :class:`~lit_entropy.reporting.dashboard.TrainDashboard` logs itself. The CUSTOM
SCALARS tab gets the same overview with related curves on one chart (:data:`LAYOUT`, written once per
run by :class:`OverviewLayout`), without any copy.
"""

from __future__ import annotations

import re
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_only

__all__ = ["LAYOUT", "MASKED_FRAC_TAG", "OverviewLayout", "overview_copies"]

MASKED_FRAC_TAG = "overview/7_masked_frac"
"""Share of response tokens the keep-mask callbacks left out of the loss (logged with at least one of them)."""

#: Source tag -> overview card (``{k}``: the number in the source tag).
_COPIES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"train/reward/mean"), "overview/1_reward"),
    (re.compile(r"val/avg@(\d+)"), "overview/2_val_avg@{k}"),
    (re.compile(r"val/pass@(\d+)"), "overview/3_val_pass@{k}"),  # the highest k of the ladder only
    (re.compile(r"train/entropy/mean"), "overview/4_entropy"),
    (re.compile(r"train/length/mean"), "overview/5_length"),
    (re.compile(r"train/clip/ratio"), "overview/6_clip_frac"),
    (re.compile(r"perf/tokens_per_s"), "overview/8_tokens_per_s"),
]


def overview_copies(metrics: dict[str, Any]) -> dict[str, Any]:
    """The overview cards among one logged dict's ``metrics`` (tag -> value), as ``{card tag: value}``.

    Of the ``val/pass@k`` ladder only the highest k is copied: the chance that one of K samples is right.
    """
    out: dict[str, Any] = {}
    best_k = -1
    for tag, value in metrics.items():
        for pattern, card in _COPIES:
            match = pattern.fullmatch(tag)
            if match is None:
                continue
            k = int(match.group(1)) if match.groups() else 0
            if card.startswith("overview/3_"):
                if k <= best_k:
                    continue
                out = {key: v for key, v in out.items() if not key.startswith("overview/3_")}
                best_k = k
            out[card.format(k=k)] = value
    return out


#: The CUSTOM SCALARS tab: {category: {chart title: ["Multiline", [tag regexes]]}} (TensorBoard's layout format).
LAYOUT: dict[str, dict[str, list[Any]]] = {
    "Overview": {
        "reward (train/reward/mean) and Avg@K (val)": ["Multiline", [r"train/reward/mean$", r"val/avg@\d+$"]],
        "Pass@k (val)": ["Multiline", [r"val/pass@\d+$"]],
        "entropy (nats per token)": ["Multiline", [r"train/entropy/(mean|kept|masked)$"]],
        "response length (tokens)": ["Multiline", [r"train/length/(mean|min|max)$", r"val/length/mean$"]],
        "clipped, masked and truncated fractions": [
            "Multiline",
            [
                r"train/clip/(ratio|low|high|dual)$",
                r"train/mask/.*",
                r"train/[^/]+/frac$",
                r"train/length/truncated_frac$",
            ],
        ],
        "generated tokens per second": ["Multiline", [r"perf/tokens_per_s$"]],
    },
    "Update": {
        "loss terms": ["Multiline", [r"train/loss/.*"]],
        "optimizer": ["Multiline", [r"train/optim/.*"]],
        "advantages": ["Multiline", [r"train/update/advantage/.*"]],
    },
    "Time": {
        "seconds per phase of a step": ["Multiline", [r"perf/time_.*"]],
        "peak memory (MiB)": ["Multiline", [r"perf/peak_memory_mb$"]],
    },
}


class OverviewLayout(Callback):
    """Write :data:`LAYOUT` into each TensorBoard run's event file at fit start (the CUSTOM SCALARS tab)."""

    @rank_zero_only
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars(LAYOUT)

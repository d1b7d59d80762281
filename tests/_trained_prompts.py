"""A callback that records what a fit trained: the prompts of every batch and the ``train/async/*`` values after it
(shared by the in-process asynchronous fits and the DDP script they launch)."""

from __future__ import annotations

from lightning.pytorch import Callback


class TrainedPrompts(Callback):
    """The prompts of every batch the module trained on, in order (read from its ``score`` calls) and the
    ``train/async/*`` values after each batch."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.metrics: list[dict[str, float]] = []

    def setup(self, trainer, pl_module, stage) -> None:
        score = pl_module.score

        def recording(batch, rollout, num_samples):
            if pl_module.training:
                self.prompts.extend(batch["prompts"])
            return score(batch, rollout, num_samples)

        pl_module.score = recording

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.metrics.append({k: float(v) for k, v in metrics.items() if k.startswith("train/async/")})

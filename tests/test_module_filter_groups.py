"""DAPO dynamic sampling in a fit: which groups each update trains on, how many generation batches it drew, and
the ``train/filter/*`` tags, against a reference computed by hand from the prompts' answers."""

from __future__ import annotations

import io
import warnings

import pytest
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.loggers import Logger

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.reporting.console import ConsoleMetrics
from lit_entropy.settings import (
    EvaluationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    RewardConfig,
    TrainingSamplingConfig,
    UpdateConfig,
)

BATCH, BATCHES, MAX_GEN = 4, 10, 2


def odd_answer_reward(completions: list[str], answers: list[str]) -> list[float]:
    """Sample 0 of a prompt with an odd answer is correct, every other sample wrong (2 samples per prompt): a group
    is informative exactly when its answer is odd. Sample 1 gets 0.5, below the threshold: correctness, not the
    reward value, decides."""
    return [float(int(a) % 2 == 1 and i % 2 == 0) or 0.5 * (i % 2) for i, a in enumerate(answers)]


class Recorder(Callback):
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/filter/")}
        self.rows.append({"step": trainer.global_step, "answers": list(batch["answers"]), "filter": metrics})


class TrainedAnswers(RFTModule):
    """Records the answers of the prompts each update trains on."""

    trained: list[list[str]]

    def log_step(self, batch, experience, completions, terms) -> None:
        self.trained.append(list(batch["answers"]))
        super().log_step(batch, experience, completions, terms)


class Written(Logger):
    """Every ``log_metrics`` call a logger gets: ``(step, keys)``."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, set[str]]] = []

    @property
    def name(self) -> str:
        return "written"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, set(metrics)))


def _reference(batches: list[list[str]]) -> list[dict]:
    """By hand: a fill ends when it holds BATCH odd-answer prompts or MAX_GEN generation batches were drawn."""
    out, kept, drawn, gens = [], [], 0, 0
    for index, answers in enumerate(batches):
        gens, drawn = gens + 1, drawn + len(answers)
        kept += [a for a in answers if int(a) % 2 == 1]
        if len(kept) >= BATCH or gens == MAX_GEN:
            trained = kept[:BATCH]
            out.append({"batch": index, "gens": gens, "drawn": drawn, "kept": len(kept), "trained": trained})
            kept, drawn, gens = [], 0, 0
    return out


class LearningRates(TrainedAnswers):
    """Also records the learning rate of every optimizer step."""

    lrs: list[float]

    def clip_and_step(self, optimizer, finite_loss=True):
        self.lrs.append(optimizer.param_groups[0]["lr"])
        return super().clip_and_step(optimizer, finite_loss)


def _fit(tiny_model_dir, module_options=None, **trainer_options):
    seed_everything(0)
    module = LearningRates(
        PolicyConfig(tiny_model_dir),
        sampling=TrainingSamplingConfig(num_samples=2, max_new_tokens=2, filter_groups=True, max_gen_batches=MAX_GEN),
        reward=RewardConfig(correct_threshold=1.0),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
        **(module_options or {}),
    )
    module.trained, module.lrs = [], []
    module.reward_fn = odd_answer_reward
    data = PromptDataModule(
        tokenizer_name_or_path=tiny_model_dir, batch_size=BATCH, num_train_examples=64, shuffle=False
    )
    recorder = Recorder()
    options = dict(logger=False, callbacks=[], max_epochs=1)
    options.update(trainer_options)
    trainer = Trainer(
        accelerator="cpu", limit_train_batches=BATCHES, limit_val_batches=0,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        **{**options, "callbacks": [recorder, *options["callbacks"]]},
    )  # fmt: skip
    trainer.fit(module, data)
    return module, data, recorder


def test_each_update_trains_on_the_first_informative_groups_of_its_fill(tiny_model_dir):
    module, data, recorder = _fit(tiny_model_dir)
    batches = [row["answers"] for row in recorder.rows]
    assert batches == [data.train_data.answers[i * BATCH : (i + 1) * BATCH] for i in range(BATCHES)]  # file order
    reference = _reference(batches)
    # the data exercises both endings: a full batch, and max_gen_batches with fewer groups
    assert {len(fill["trained"]) == BATCH for fill in reference} == {True, False}

    assert module.trained == [fill["trained"] for fill in reference if fill["trained"]]
    updates = [i for i, row in enumerate(recorder.rows) if row["step"] > (recorder.rows[i - 1]["step"] if i else 0)]
    assert updates == [fill["batch"] for fill in reference if fill["trained"]]
    for fill in reference:
        if fill["trained"]:
            assert recorder.rows[fill["batch"]]["filter"] == {
                "train/filter/gen_batches": fill["gens"],
                "train/filter/groups_drawn": fill["drawn"],
                "train/filter/groups_kept": fill["kept"],
                "train/filter/groups_trained": len(fill["trained"]),
            }


def test_training_scalars_are_written_only_at_the_batches_that_updated(tiny_model_dir):
    """Between two updates Lightning alone would write the last update's ``train/*`` again at every generation
    batch; each update's scalars appear once, at the batch that ended its fill, in the logger and on the console."""
    logger, stream = Written(), io.StringIO()
    _, _, recorder = _fit(tiny_model_dir, logger=logger, log_every_n_steps=1, callbacks=[ConsoleMetrics(stream)])
    reference = _reference([row["answers"] for row in recorder.rows])
    updated = [fill["batch"] for fill in reference if fill["trained"]]
    assert 0 < len(updated) < BATCHES  # some generation batches end without an update
    written = sorted({step for step, keys in logger.rows if any(key.startswith("train/") for key in keys)})
    assert written == updated
    for step, keys in logger.rows:
        if step in updated:
            assert {"train/reward/mean", "train/filter/gen_batches"} <= keys
    printed = [int(line.split(" | ")[0].split()[1]) for line in stream.getvalue().splitlines() if "reward" in line]
    assert printed == updated


def test_the_lr_schedule_counts_optimizer_updates_and_decays_over_max_steps(tiny_model_dir):
    """Warm-up and decay advance once per optimizer step (generation batches without an update leave them), and
    ``trainer.max_steps``, which counts optimizer steps, sizes the decay: two updates per fill (update.epochs 2),
    warm-up 2, linear decay, max_steps 6: the documented multipliers (k+1)/2, then 1 - (k-2)/(6-2)."""
    base, steps, warmup = 1e-3, 6, 2
    options = dict(optim=OptimConfig(lr=base, warmup_steps=warmup, lr_schedule="linear"), update=UpdateConfig(epochs=2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # max_steps sizes the schedule: no warning
        warnings.filterwarnings("ignore", message=".*(max_gen_batches|LeafSpec|num_workers).*")
        module, _, recorder = _fit(tiny_model_dir, module_options=options, max_steps=steps)
    expected = [base * ((k + 1) / warmup if k < warmup else 1 - (k - warmup) / (steps - warmup)) for k in range(steps)]
    assert module.lrs == pytest.approx(expected)
    updated = [fill["batch"] for fill in _reference([row["answers"] for row in recorder.rows]) if fill["trained"]]
    assert len(recorder.rows) == updated[steps // 2 - 1] + 1 > steps // 2  # batches without an update in between


def test_a_decaying_schedule_without_max_steps_warns_that_it_stops_short(tiny_model_dir):
    options = dict(optim=OptimConfig(lr_schedule="cosine"))
    with pytest.warns(UserWarning, match=r"spans 10 optimizer steps .* set trainer.max_steps"):
        module, _, _ = _fit(tiny_model_dir, module_options=options)
    assert 0 < len(module.lrs) < 10  # fewer updates than generation batches: the cosine did not reach its end

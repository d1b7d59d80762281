"""DAPO dynamic sampling in a fit: which groups each update trains on, how many generation batches it drew, and
the ``train/filter/*`` tags, against a reference computed by hand from the prompts' answers."""

from __future__ import annotations

from lightning.pytorch import Callback, Trainer, seed_everything

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.settings import EvaluationConfig, LoggingConfig, PolicyConfig, RewardConfig, TrainingSamplingConfig

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

    def log_step(self, batch, batch_idx, experience, completions, terms) -> None:
        self.trained.append(list(batch["answers"]))
        super().log_step(batch, batch_idx, experience, completions, terms)


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


def test_each_update_trains_on_the_first_informative_groups_of_its_fill(tiny_model_dir):
    seed_everything(0)
    module = TrainedAnswers(
        PolicyConfig(tiny_model_dir),
        sampling=TrainingSamplingConfig(num_samples=2, max_new_tokens=2, filter_groups=True, max_gen_batches=MAX_GEN),
        reward=RewardConfig(correct_threshold=1.0),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module.trained = []
    module.reward_fn = odd_answer_reward
    data = PromptDataModule(
        tokenizer_name_or_path=tiny_model_dir, batch_size=BATCH, num_train_examples=64, shuffle=False
    )
    recorder = Recorder()
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=BATCHES, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[recorder],
    )  # fmt: skip
    trainer.fit(module, data)
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

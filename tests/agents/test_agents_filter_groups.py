"""``model.sampling.multi_turn`` with ``model.sampling.filter_groups`` (DAPO dynamic sampling): the fill keeps whole
trajectories (environment masks, records, per-turn rewards) across generation batches and through a checkpoint."""

from __future__ import annotations

import io

import torch
from lightning.pytorch import Trainer, seed_everything

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.assets import TINY_MODEL_DIR
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.settings import LoggingConfig, OptimConfig, PolicyConfig, TrainingSamplingConfig
from lit_entropy.step.group_fill import GroupFill
from tests._trained_prompts import TrainedPrompts
from tests.agents.test_agents_rollout import _run

REPLIES = [["3<eos>", "6<eos>"], ["6<eos>"]]  # row 0 guesses 3 then 6 (2 turns), row 1 guesses 6 at once


def _rollout():
    _, out = _run(
        REPLIES, questions=("a", "b"), answers=("6", "6"), environment="tests.agents._agents:Guess",
        reward_placement="per_turn",
    )  # fmt: skip
    return out


def _batch(out):
    width = out.prompt_length
    return {
        "input_ids": out.sequences[:, :width], "attention_mask": out.attention_mask[:, :width], "prompts": ["a", "b"],
        "answers": ["6", "6"],
    }  # fmt: skip


def test_a_fill_keeps_the_trajectories_of_its_groups_and_survives_a_checkpoint():
    first, second = _rollout(), _rollout()
    rewards = torch.tensor([0.9, 1.0])
    fill = GroupFill().add(_batch(first), first, rewards, ["6", "6"], keep=torch.tensor([False, True]))
    fill = fill.add(_batch(second), second, rewards, ["6", "6"], keep=torch.tensor([True, False]))
    # through a checkpoint as Lightning writes and reads it (plain data only)
    buffer = io.BytesIO()
    torch.save(fill.state_dict(), buffer)
    buffer.seek(0)
    restored = GroupFill.from_state_dict(torch.load(buffer, weights_only=True))
    for state in (fill, restored):
        taken = state.take(2, pad_token_id=0)
        rollout = taken.rollout
        # row 0 is the first batch's row 1, row 1 the second batch's row 0: masks and records follow their rows
        width = rollout.response_mask.shape[1]
        for row, (source, index) in enumerate([(first, 1), (second, 0)]):
            n = source.response_mask.shape[1]
            assert torch.equal(rollout.environment_mask[row, :n], source.environment_mask[index])
            assert not rollout.environment_mask[row, n:].any() and width >= n
            assert rollout.trajectories.turns[row] == source.trajectories.turns[index]
            assert rollout.trajectories.conversations[row] == source.trajectories.conversations[index]
            assert rollout.trajectories.turn_rewards[row] == source.trajectories.turn_rewards[index]
        assert rollout.trajectories.turns.tolist() == [1, 2]
    assert restored.pieces[0]["trajectories"].environments == [None]  # environments are not checkpointed


def test_a_fit_with_dynamic_sampling_trains_informative_multi_turn_groups(tmp_path):
    """The guessing game, exact_match + speed bonus: a group whose games are all solved or all lost is dropped."""
    seed_everything(0)
    model_dir = str(TINY_MODEL_DIR.with_name("tiny-qwen2-guess"))
    module = RFTModule(
        PolicyConfig(model_dir),
        sampling=TrainingSamplingConfig(
            num_samples=4,
            max_new_tokens=48,
            filter_groups=True,
            max_gen_batches=4,
            multi_turn=MultiTurnConfig(environment="lit_entropy.environments.guessing_game:GuessingGame", max_turns=6),
        ),
        optim=OptimConfig(lr=1e-3),
        logging=LoggingConfig(export_on_train_end=False),
    )
    data = PromptDataModule(
        tokenizer_name_or_path=model_dir, train_dataset="lit_entropy.environments.guessing_game:train_rows",
        val_dataset=None, apply_chat_template=True, batch_size=4, num_train_examples=64, seed=3,
    )  # fmt: skip
    record = TrainedPrompts()
    trainer = Trainer(
        accelerator="cpu", max_steps=2, limit_train_batches=12, limit_val_batches=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[record],
    )  # fmt: skip
    trainer.fit(module, data)
    assert trainer.global_step == 2
    metrics = trainer.callback_metrics
    assert float(metrics["train/filter/groups_trained"]) > 0
    # the last update's fill drew two generation batches and dropped their uninformative groups
    assert float(metrics["train/filter/gen_batches"]) >= 2
    assert float(metrics["train/filter/groups_drawn"]) > float(metrics["train/filter/groups_kept"])
    assert float(metrics["train/multi_turn/turns"]) > 1.0
    assert float(metrics["train/multi_turn/environment_token_frac"]) > 0

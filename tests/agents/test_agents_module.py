"""``model.sampling.multi_turn`` in RFTModule and the CLI: settings parse, bad ones fail before training, a fit runs."""

from __future__ import annotations

import pytest
import yaml
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger

from lit_entropy.agents import MultiTurnConfig
from lit_entropy.cli import cli_main
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.models.tiny import save_tiny_model
from lit_entropy.module import RFTModule
from lit_entropy.settings import (
    EvaluationConfig,
    LoggingConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    TrainingSamplingConfig,
)
from tests.agents._agents import CHAT_TEMPLATE, REWRITING_TEMPLATE, chat_tokenizer


@pytest.fixture(scope="module")
def chat_model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("chat_fit"), chat_tokenizer()))


def test_the_cli_reads_model_sampling_multi_turn_in_both_environment_forms(tmp_path, monkeypatch, chat_model_dir):
    monkeypatch.chdir(tmp_path)
    env = {"class_path": "tests.agents._agents.Calculator", "init_args": {"bonus": 0.5}}  # dotted, as Lightning
    config = {
        "model": {
            "policy": {"model_name_or_path": chat_model_dir},
            "sampling": {"multi_turn": {"environment": env, "tools": ["tests.agents._agents:add"], "max_turns": 2}},
        }
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cli = cli_main(["--config", "c.yaml", "--trainer.accelerator=cpu"], run=False)
    assert cli.model.settings.sampling.multi_turn == MultiTurnConfig(env, ["tests.agents._agents:add"], max_turns=2)
    assert cli.model.multi_turn.environments.session().environment.bonus == 0.5
    cli = cli_main(
        ["--model.sampling.multi_turn.environment=tests.agents._agents:Guess", "--trainer.accelerator=cpu"], run=False
    )
    assert cli.model.multi_turn.environments.text


def test_an_environment_argument_overridden_on_the_command_line_reaches_init_args(tmp_path, monkeypatch):
    """jsonargparse hands ``--model.sampling.multi_turn.environment.init_args.max_turns=4`` to the dict setting as a
    key beside ``class_path``: it is an init argument, over the config's."""
    monkeypatch.chdir(tmp_path)
    env = {"class_path": "lit_entropy.environments.guessing_game.GuessingGame", "init_args": {"max_turns": 6}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump({"model": {"sampling": {"multi_turn": {"environment": env}}}}))
    args = [
        "--config",
        "c.yaml",
        "--model.sampling.multi_turn.environment.init_args.max_turns=4",
        "--trainer.accelerator=cpu",
    ]
    cli = cli_main(args, run=False)
    assert cli.model.settings.sampling.multi_turn.environment["init_args"] == {"max_turns": 4}
    assert cli.model.multi_turn.environments.session().environment.max_turns == 4


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_turns": 0}, "model.sampling.multi_turn.max_turns"),
        ({"environment": "tests.agents._agents:Nope"}, "model.sampling.multi_turn.environment"),
        ({"environment": None, "tools": None}, "multi_turn.environment and model.sampling.multi_turn.tools"),
        ({"tool_parser": "pythonic"}, "model.sampling.multi_turn.tool_parser"),
        ({"environment": "tests.agents._agents:Guess", "tools": ["tests.agents._agents:add"]}, "text environment"),
    ],
)
def test_bad_settings_fail_at_construction_naming_the_setting(settings, message):
    with pytest.raises(ValueError, match=message):
        config = MultiTurnConfig(**{"environment": "tests.agents._agents:Calculator", **settings})
        RFTModule(sampling=TrainingSamplingConfig(multi_turn=config))


def test_a_template_that_rewrites_turns_is_refused_at_setup(chat_model_dir):
    module = RFTModule(
        policy=PolicyConfig(chat_model_dir),
        sampling=TrainingSamplingConfig(
            multi_turn=MultiTurnConfig(environment="tests.agents._agents:Guess", chat_template=REWRITING_TEMPLATE)
        ),
    )
    with pytest.raises(ValueError, match="model.sampling.multi_turn.chat_template rewrites earlier turns"):
        module.setup("fit")


@pytest.mark.parametrize(
    ("environment", "algorithm", "placement"),
    [
        ("tests.agents._agents:Guess", "grpo", "last_token"),
        ("tests.agents._agents:Calculator", "grpo", "last_token"),
        ("tests.agents._agents:Guess", "ppo", "per_turn"),  # the critic gets each turn's reward
    ],
)
def test_a_short_fit_with_an_environment(chat_model_dir, tmp_path, environment, algorithm, placement):
    seed_everything(0)
    module = RFTModule(
        policy=PolicyConfig(chat_model_dir),
        algorithm=algorithm,
        sampling=TrainingSamplingConfig(
            num_samples=4,
            max_new_tokens=24,
            multi_turn=MultiTurnConfig(
                environment=environment, max_turns=3, chat_template=CHAT_TEMPLATE, reward_placement=placement
            ),
        ),
        optim=OptimConfig(lr=1e-3),
        evaluation=EvaluationConfig(num_samples=2),
        loss=LossConfig(mask_truncated=True),
        logging=LoggingConfig(log_samples_every_n_steps=1),
    )
    data = PromptDataModule(
        tokenizer_name_or_path=chat_model_dir, batch_size=2, num_train_examples=8, num_val_examples=4,
        apply_chat_template=True,
    )  # fmt: skip
    trainer = Trainer(
        accelerator="cpu", max_steps=2, logger=TensorBoardLogger(tmp_path, name="run"), enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, limit_val_batches=1, val_check_interval=2,
        log_every_n_steps=1,
    )  # fmt: skip

    trainer.fit(module, data)
    assert trainer.global_step == 2
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: PLC0415 - slow import

    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    tags = set(events.Tags()["scalars"])
    stops = {f"train/multi_turn/stop/{r}" for r in ("eos", "max_turns", "length", "done")}
    names = ("turns", "tool_calls", "tool_error_rate", "environment_token_frac", "environment_reward")
    assert {f"train/multi_turn/{n}" for n in names} | stops <= tags
    (table,) = [t for t in events.Tags()["tensors"] if t.startswith("train/samples")]
    text = events.Tensors(table)[-1].tensor_proto.string_val[0].decode()
    assert "**assistant**:" in text and "(stop: " in text

"""`lit_entropy.agents.openenv.OpenEnvTextEnvironment`: an OpenEnv environment (or client) as a text environment,
in the rollout loop and from a config. Skipped, with the reason, where openenv-core is not installed."""

from __future__ import annotations

import pytest
import yaml

from lit_entropy.agents.openenv import OpenEnvTextEnvironment
from tests.agents._openenv import load_openenv

OPENENV = load_openenv()  # skips this module without openenv-core

pytestmark = pytest.mark.openenv

ADAPTER = "lit_entropy.agents.openenv.OpenEnvTextEnvironment"
GUESS = {"env": "tests.agents.openenv_guess:GuessEnvironment", "action": "tests.agents.openenv_guess:GuessAction"}


@pytest.mark.parametrize("env", [GUESS["env"], "tests.agents.openenv_guess:GuessClient"])
def test_the_adapter_plays_an_openenv_environment_and_a_client(env):
    game = OpenEnvTextEnvironment(env, GUESS["action"], reset_fields=["answer"])
    assert isinstance(game.env.env if hasattr(game.env, "env") else game.env, OPENENV.Environment)
    assert game.reset({"answer": "6", "prompt": "p"}) == "guess"  # the only own field of the observation
    assert game.step("3") == ("higher", pytest.approx(-0.1), False)
    assert game.step("x") == ("NaN", pytest.approx(-0.1), False)
    assert game.step("6") == ("", 1.0, True)


def test_observation_field_and_json_rendering_and_errors():
    game = OpenEnvTextEnvironment(**GUESS, observation_field="feedback", env_args={"opening": "go"})
    assert game.reset({"answer": "2"}) == "go"  # no reset_fields: the environment's default secret, 0
    assert game.step("1") == ("lower", pytest.approx(-0.1), False)
    with pytest.raises(KeyError, match="observation_field: 'nope' is not a field of GuessObservation"):
        OpenEnvTextEnvironment(**GUESS, observation_field="nope").reset({})
    with pytest.raises(KeyError, match="reset_fields: the dataset row has no \\['seed'\\]"):
        OpenEnvTextEnvironment(**GUESS, reset_fields=["seed"]).reset({"answer": "1"})
    with pytest.raises(ValueError, match="model.sampling.multi_turn.environment.init_args.env"):
        OpenEnvTextEnvironment("tests.agents.openenv_guess:Nope", GUESS["action"])


def test_a_multi_turn_rollout_with_an_openenv_environment():
    """The scripted policy guesses 3, 9, 6: the game's observations are the user turns, its rewards the turn's."""
    from tests.agents.test_agents_rollout import _run  # noqa: PLC0415 - reason: after the module-level skip

    environment = {"class_path": ADAPTER, "init_args": {**GUESS, "reset_fields": ["answer"]}}
    _, out = _run([["3<eos>"], ["9<eos>"], ["6<eos>"]], environment=environment, reward_placement="per_turn")
    records = out.trajectories
    roles = [(m["role"], m["content"]) for m in records.conversations[0]]
    assert roles == [
        ("user", "guess"), ("assistant", "3"), ("user", "higher"), ("assistant", "9"), ("user", "lower"),
        ("assistant", "6"),
    ]  # fmt: skip
    assert records.environment_rewards.tolist() == pytest.approx([0.8])
    assert [r for _, r in records.turn_rewards[0]] == pytest.approx([-0.1, -0.1, 1.0])


def test_the_cli_reads_an_openenv_environment(tmp_path, monkeypatch):
    from lit_entropy.cli import cli_main  # noqa: PLC0415 - reason: after the module-level skip

    monkeypatch.chdir(tmp_path)
    config = {
        "model": {
            "sampling": {"multi_turn": {"environment": {"class_path": ADAPTER, "init_args": GUESS}, "max_turns": 3}}
        }
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(config))
    cli = cli_main(["--config", "c.yaml", "--trainer.accelerator=cpu"], run=False)
    environments = cli.model.multi_turn.environments
    assert environments.text and isinstance(environments.session().environment, OpenEnvTextEnvironment)

"""Registering a policy loss or an advantage estimator makes its name valid in the settings, listed by ``--help``
and named by the error that refuses an unknown name, with no second edit; an import path ``pkg.module:function``
names a function of the user's module without a launcher (imported from the working directory, checked at setup)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from lit_entropy.cli import cli_main, main
from lit_entropy.functional import (
    ADVANTAGE_ESTIMATORS,
    POLICY_LOSSES,
    ppo_policy_loss,
    register_advantage_estimator,
    register_policy_loss,
)
from lit_entropy.settings import RFTSettings

GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
LOSS, ESTIMATOR = "test_cli_halved_ppo", "test_cli_success_estimator"


@pytest.fixture
def registered_names():
    """A policy loss and an estimator registered for one test (removed afterwards)."""

    @register_policy_loss(LOSS)
    def halved_ppo(logprobs, old_logprobs, advantages, mask, **options):
        loss, stats = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, **options)
        return 0.5 * loss, stats

    @register_advantage_estimator(ESTIMATOR)
    def success_estimator(token_rewards, mask, *, group_size, values=None, **extra):
        return (token_rewards.sum(-1, keepdim=True) > 0).float() * mask, None

    yield
    POLICY_LOSSES.unregister(LOSS)
    ADVANTAGE_ESTIMATORS.unregister(ESTIMATOR)


def test_registered_names_pass_settings_validation(registered_names):
    settings = RFTSettings.build(loss={"policy_loss": LOSS}, advantages={"estimator": ESTIMATOR})
    assert (settings.loss.policy_loss, settings.advantages.estimator) == (LOSS, ESTIMATOR)


def test_unregistered_names_are_refused_with_the_key_the_value_and_the_registered_names(registered_names):
    with pytest.raises(ValueError) as loss_error:
        RFTSettings.build(loss={"policy_loss": "nope"})
    message = str(loss_error.value)
    assert POLICY_LOSSES.names()[-1] == LOSS
    assert message.startswith(
        f"model.loss.policy_loss must be a registered policy loss, one of {POLICY_LOSSES.names()}, or an import path "
        "'pkg.module:function', got 'nope'"
    )
    assert message.endswith("got 'nope' (add one with @lit_entropy.functional.register_policy_loss(name))")
    with pytest.raises(ValueError, match=rf"model.advantages.estimator must be .*'{ESTIMATOR}'.*got 'nope'"):
        RFTSettings.build(advantages={"estimator": "nope"})
    POLICY_LOSSES.unregister(LOSS)
    try:  # unregistered again: refused again
        with pytest.raises(ValueError) as again:
            RFTSettings.build(loss={"policy_loss": LOSS})
        assert LOSS not in POLICY_LOSSES.names() and f"one of {POLICY_LOSSES.names()}, or an" in str(again.value)
    finally:
        register_policy_loss(LOSS)(ppo_policy_loss)


def test_the_estimator_defaults_to_the_algorithms_and_must_fit_its_critic():
    assert RFTSettings.build().advantages.estimator == "grpo"
    assert RFTSettings.build(algorithm="ppo").advantages.estimator == "gae"
    with pytest.raises(ValueError) as without_critic:
        RFTSettings.build(advantages={"estimator": "gae"})
    assert str(without_critic.value) == (
        "model.advantages.estimator='gae' needs a critic's values, but model.algorithm is 'grpo': set "
        "model.algorithm: ppo (the critic is configured in model.ppo) or pick an estimator without a critic, one "
        f"of {tuple(n for n in ADVANTAGE_ESTIMATORS.names() if n != 'gae')}"
    )
    with pytest.raises(ValueError, match=r"model.algorithm='ppo' trains a critic .* model.advantages.estimator='grpo'"):
        RFTSettings.build(algorithm="ppo", advantages={"estimator": "grpo"})


def test_help_lists_the_registered_names(registered_names, capsys):
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert re.search(rf"--model.loss.policy_loss POLICY_LOSS .*? Registered: ppo, [^(]*{LOSS}\.", out)
    assert re.search(rf"--model.advantages.estimator ESTIMATOR .*? Registered: grpo, gae, [^(]*{ESTIMATOR}\.", out)


def test_the_cli_accepts_a_registered_name_and_refuses_others_in_one_line(
    registered_names, tmp_path, monkeypatch, capsys
):
    monkeypatch.chdir(tmp_path)
    cli = cli_main(["--config", str(GRPO_TINY), f"--model.loss.policy_loss={LOSS}"], run=False)
    assert cli.model.settings.loss.policy_loss == LOSS
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(GRPO_TINY), "--model.advantages.estimator=nope"])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-entropy")]
    assert err == [
        "lit-entropy: error: model.advantages.estimator must be a registered advantage estimator, one of "
        f"{ADVANTAGE_ESTIMATORS.names()}, or an import path 'pkg.module:function', got 'nope' (add one with "
        "@lit_entropy.functional.register_advantage_estimator(name))"
    ]


USER_MODULE = """
from lit_entropy.functional import ppo_policy_loss

CALLS = []


def halved_ppo(logprobs, old_logprobs, advantages, mask, **options):
    CALLS.append(sorted(options))
    loss, stats = ppo_policy_loss(logprobs, old_logprobs, advantages, mask, **options)
    return 0.5 * loss, stats


def success_estimator(token_rewards, mask, *, group_size, values=None, **extra):
    return (token_rewards.sum(-1, keepdim=True) > 0).float() * mask, None


def no_options(token_rewards, mask):
    return mask.float(), None
"""


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """``cli_user_losses.py`` in the working directory (not on ``sys.path``), as a user's file beside a config."""
    import sys

    (tmp_path / "cli_user_losses.py").write_text(USER_MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    yield "cli_user_losses"
    sys.modules.pop("cli_user_losses", None)
    for registry in (POLICY_LOSSES, ADVANTAGE_ESTIMATORS):
        for path in [p for p in registry._imported if p.startswith("cli_user_losses:")]:
            registry.unregister(path)


def test_the_cli_takes_a_loss_and_an_estimator_by_import_path_from_the_working_directory(user_module):
    loss, estimator = f"{user_module}:halved_ppo", f"{user_module}:success_estimator"
    argv = ["--config", str(GRPO_TINY), f"--model.loss.policy_loss={loss}", f"--model.advantages.estimator={estimator}"]
    cli = cli_main(argv, run=False)
    settings = cli.model.settings
    assert (settings.loss.policy_loss, settings.advantages.estimator) == (loss, estimator)
    assert POLICY_LOSSES[loss].__module__ == user_module and loss not in POLICY_LOSSES.names()


def test_an_import_path_that_does_not_fit_is_refused_in_one_line_before_a_model_loads(user_module, monkeypatch, capsys):
    import transformers

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", no_model)
    for argv, message in (
        (
            f"--model.advantages.estimator={user_module}:no_options",
            f"model.advantages.estimator='{user_module}:no_options' cannot take the advantage estimator call "
            f"{ADVANTAGE_ESTIMATORS.call.describe()}: got an unexpected keyword argument 'group_size'",
        ),
        (
            "--model.loss.policy_loss=no_such_module:loss",
            "model.loss.policy_loss: no module named 'no_such_module', neither on sys.path nor in the working "
            f"directory {Path.cwd()}; run lit-entropy from the directory that holds no_such_module.py (or the "
            "package no_such_module/), or add that directory to PYTHONPATH, got 'no_such_module:loss'",
        ),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(["fit", "--config", str(GRPO_TINY), argv])
        assert exit_info.value.code == 2
        err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-entropy")]
        assert err == [f"lit-entropy: error: {message}"]

"""The lit-entropy CLI: every shipped config parses and instantiates (no weights loaded); bad input fails early."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lit_entropy.callbacks import EntropyDiscriminatorClipping
from lit_entropy.cli import cli_main
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
GRPO_TINY = next(p for p in CONFIGS if p.name == "grpo_tiny.yaml")
CLIP_B_TINY = next(p for p in CONFIGS if p.name == "clip_b_tiny.yaml")
# GPU recipes are instantiated on this CPU machine with the accelerator overridden.
CPU_OVERRIDES = ["--trainer.accelerator=cpu", "--trainer.devices=1"]


def test_configs_exist():
    names = {p.name for p in CONFIGS}
    for required in (
        "grpo_tiny.yaml",
        "clip_b_tiny.yaml",
        "clip_v_tiny.yaml",
        "ppo_tiny.yaml",
        "gspo_tiny.yaml",
        "cispo_tiny.yaml",
        "qwen2.5-7b_grpo.yaml",
        "qwen2.5-7b_clip_b.yaml",
        "qwen2.5-7b_clip_v.yaml",
    ):
        assert required in names


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_config_parses_and_instantiates(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    cli = cli_main(["--config", str(config), *CPU_OVERRIDES], run=False)
    assert isinstance(cli.model, RFTModule)
    assert isinstance(cli.datamodule, PromptDataModule)
    assert cli.model.policy is None, "instantiation must not load weights"
    assert cli.datamodule.tokenizer_name_or_path == cli.config["model"]["policy"]["model_name_or_path"]
    clip = [cb for cb in cli.trainer.callbacks if isinstance(cb, EntropyDiscriminatorClipping)]
    if "clip_b" in config.name:
        assert [cb.method for cb in clip] == ["clip_b"]
    elif "clip_v" in config.name:
        assert [cb.method for cb in clip] == ["clip_v"]
    else:
        assert not clip


@pytest.mark.parametrize(
    ("name", "loss"),
    [
        ("gspo_tiny.yaml", {"policy_loss": "gspo", "clip_ratio_low": 3e-4, "clip_ratio_high": 4e-4,
                            "clip_ratio_c": None, "loss_agg_mode": "seq-mean-token-mean"}),
        ("cispo_tiny.yaml", {"policy_loss": "cispo", "clip_ratio_low": 0.99, "clip_ratio_high": 0.28,
                             "clip_ratio_c": None, "loss_agg_mode": "token-mean"}),
    ],
)  # fmt: skip
def test_peer_loss_configs_are_the_embedded_default_with_the_papers_loss(name, loss):
    """gspo_tiny / cispo_tiny change only ``model.loss`` (the paper's ranges and aggregation) and the run's name."""
    import yaml

    base = yaml.safe_load(GRPO_TINY.read_text())
    config = yaml.safe_load(next(p for p in CONFIGS if p.name == name).read_text())
    assert config["trainer"]["logger"]["init_args"].pop("name") == name.removesuffix(".yaml")
    base["trainer"]["logger"]["init_args"].pop("name")
    got_loss, base_loss = config["model"].pop("loss"), base["model"].pop("loss")
    assert config == base
    assert got_loss == {**base_loss, **loss}


def test_recipes_follow_the_paper():
    """THEORY §5: 64 prompts/step, group 16 (Clip_B) / 8 (Clip_V), lr 1e-6, kl 0, token-mean, T=1.0, eval 32 @ 0.7."""
    for name, group in (("qwen2.5-7b_clip_b.yaml", 16), ("qwen2.5-7b_clip_v.yaml", 8)):
        config = next(p for p in CONFIGS if p.name == name)
        cli = cli_main(["--config", str(config), *CPU_OVERRIDES], run=False)
        settings = cli.model.settings
        sampling, loss, evaluation = settings.sampling, settings.loss, settings.evaluation
        assert sampling.num_samples == group and sampling.temperature == 1.0 and sampling.max_new_tokens == 7168
        assert settings.optim.lr == 1e-6 and loss.kl_coef == 0 and loss.loss_agg_mode == "token-mean"
        assert loss.clip_ratio_low == loss.clip_ratio_high == 0.2
        assert evaluation.num_samples == 32 and evaluation.temperature == 0.7
        assert settings.update.epochs == 1 and settings.update.mini_batch_size is None  # one step per batch
        assert cli.datamodule.max_prompt_length == 1024
        assert cli.datamodule.batch_size * cli.config["trainer"]["devices"] == 64 or cli.datamodule.batch_size == 8


def test_print_config(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", "--config", str(GRPO_TINY), "--print_config"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "model:" in out and "  sampling:\n    num_samples: 8" in out and "val_before_train:" in out
    assert "  loss:\n    policy_loss: ppo\n    clip_ratio_low: 0.2" in out and "group_size" not in out


def test_help_documents_every_setting_from_its_docstring(capsys):
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--model.loss.clip_ratio_high" in out and "DAPO clip-higher: 0.28" in out
    assert "--model.sampling.num_samples" in out and "the GRPO group size" in out
    assert "--model.ppo.help" in out and "PPO-only settings" in out  # optional group: its own --help


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("config", r"model.group_size -> model.sampling.num_samples; model.lr -> model.optim.lr"),
        ("command line", r"model.dual_clip_c -> model.loss.clip_ratio_c"),
    ],
)
def test_old_flat_keys_name_their_new_place(where, message, tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  group_size: 8\n  lr: 1.0e-5\n")
    args = ["fit", "--config", str(old)] if where == "config" else ["fit", "--model.dual_clip_c=3"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(args)
    assert exit_info.value.code == 2
    assert len(__import__("re").findall(message, capsys.readouterr().err)) == 1


@pytest.mark.parametrize("where", ["config", "command line"])
def test_renamed_grouped_keys_name_their_new_dotted_key(where, tmp_path, capsys):
    old = tmp_path / "old.yaml"
    old.write_text("model:\n  update:\n    fuse_old_logprob_pass: false\n")
    given = ["--config", str(old)] if where == "config" else ["--model.policy.fused_lm_head=false"]
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["fit", *given])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    if where == "config":
        assert "model.update.fuse_old_logprob_pass -> model.update.reuse_statistics_forward" in err
    else:
        assert "model.policy.fused_lm_head -> model.policy.blockwise_lm_head" in err


def test_unknown_config_key_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  group_sise: 8\n")
    with pytest.raises(SystemExit):
        cli_main(["fit", "--config", str(bad)])
    assert "group_sise" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (["--model.sampling.num_samples=1"], r"model.sampling.num_samples must be >= 2 for grpo, got 1"),
        (["--model.evaluation.pass_k=[16]"], r"model.evaluation.pass_k \(K=8\) must be an integer in \[1, 8\], got 16"),
        (["--model.reward.fn=no_such_pkg.mod:fn"], r"model.reward.fn: no module named 'no_such_pkg.mod'"),
        (["--model.loss.clip_ratio_low=1.5"], r"model.loss.clip_ratio_low must be a number in \[0, 1\), got 1.5"),
        (["--model.loss.kl_type=k4"], r"model.loss.kl_type must be one of \('k1', 'kl'.*got 'k4'"),
        (
            ["--model.optim.optimizer=torch.optim.SGD", "--model.optim.optimizer.lr=0.1"],
            r"model.optim.lr=0.0003 / model.optim.weight_decay=None would be ignored",
        ),
        (
            ["--trainer.callbacks+=lit_entropy.callbacks.EntropyDiscriminatorClipping", "--trainer.callbacks.mu=0"],
            r"mu must be a finite number > 0, got 0",
        ),
    ],
)
def test_bad_settings_fail_before_training(override, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=message):
        cli_main(["--config", str(GRPO_TINY), *override], run=False)


def _scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_fit_then_validate_end_to_end(tmp_path, monkeypatch):
    """The README command on a few batches: val at step 0, train tags, a checkpoint that `validate` reads."""
    monkeypatch.chdir(tmp_path)
    short = [
        "--trainer.max_epochs=1",
        "--trainer.limit_train_batches=3",
        "--trainer.val_check_interval=3",
        "--trainer.enable_progress_bar=false",
        "--data.num_train_examples=64",
        "--data.num_val_examples=16",
        "--data.val_batch_size=16",
    ]
    cli_main(["fit", "--config", str(CLIP_B_TINY), *short])
    log_dir = tmp_path / "runs" / "clip_b_tiny" / "version_0"
    scalars = _scalars(log_dir)
    assert [step for step, _ in scalars["val/avg@8"]] == [0, 3], "validation before training, then after 3 batches"
    for tag in ("train/reward/mean", "train/entropy/mean", "train/entropy_clip/frac", "perf/tokens_per_s"):
        assert len(scalars[tag]) == 3, tag
    assert (log_dir / "config.yaml").exists()
    checkpoints = sorted((log_dir / "checkpoints").glob("*.ckpt"))
    assert checkpoints
    cli_main(
        [
            "validate",
            "--config",
            str(CLIP_B_TINY),
            "--ckpt_path",
            str(checkpoints[-1]),
            "--trainer.logger=false",
            "--data.num_val_examples=16",
            "--data.val_batch_size=16",
        ]
    )


def test_multinode_recipe_parses(tmp_path, monkeypatch):
    """The documented 2-node recipe: 7B Clip_B + FSDP2 + multinode overlays compose into 16 ranks x 4 prompts."""
    from lit_entropy.cli import RFTCLI

    class ParseOnly(RFTCLI):
        def instantiate_classes(self) -> None:  # a GPU trainer cannot be built on this machine
            pass

    monkeypatch.chdir(tmp_path)
    names = ("qwen2.5-7b_clip_b.yaml", "fsdp2.yaml", "multinode.yaml")
    args = [a for name in names for a in ("--config", str(next(p for p in CONFIGS if p.name == name)))]
    config = ParseOnly(RFTModule, PromptDataModule, args=args, run=False, auto_configure_optimizers=False).config
    assert config["trainer"]["num_nodes"] == 2 and config["trainer"]["devices"] == 8
    assert config["trainer"]["strategy"]["class_path"] == "lit_entropy.distributed.FSDP2Strategy"
    rollout = config["model"]["rollout"]
    assert rollout["class_path"] == "lit_entropy.rollout.VLLMRolloutEngine"
    assert rollout["init_args"]["tensor_parallel_size"] == 1 and rollout["init_args"]["enable_sleep"] is True
    assert config["data"]["batch_size"] * 2 * 8 == 64
    assert config["model"]["sampling"]["num_samples"] == 16
    assert config["model"]["policy"]["gradient_checkpointing"] is True


# ---------------------------------------------------------------------------- issue 11: the CLI surface
SHORT_FIT = [
    "--trainer.enable_progress_bar=false",
    "--data.num_train_examples=64",
    "--data.num_val_examples=16",
    "--data.val_batch_size=16",
]


def test_version_and_help_list_every_command(capsys):
    from lit_entropy import __version__
    from lit_entropy.cli import main

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"lit-entropy {__version__}"
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert "lit_entropy: reinforcement fine-tuning" in out and "Lightning Trainer command line tool" not in out
    assert "{fit,validate,test,export}" in out and "predict" not in out
    for command in ("fit", "validate", "test", "export"):
        assert f"\n  {command} " in out, command
    with pytest.raises(SystemExit) as exit_info:
        main(["fitt"])
    assert exit_info.value.code == 2 and "unknown command 'fitt'" in capsys.readouterr().err


def test_help_and_the_cli_package_load_neither_lightning_nor_transformers():
    """``lit-entropy --help`` answers before any heavy import (``import lightning`` alone loads transformers)."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from lit_entropy.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "print('LOADED', sorted(m for m in ('lightning', 'transformers', 'torch', 'datasets') if m in sys.modules))\n"
    )
    env = {**__import__("os").environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert "LOADED []" in out and "commands:" in out


def test_a_command_builds_only_its_own_settings_parser(capsys, tmp_path, monkeypatch):
    from lit_entropy.cli import RFTCLI

    class ParseOnly(RFTCLI):
        def _run_subcommand(self, subcommand: str) -> None:
            pass

    monkeypatch.chdir(tmp_path)
    cli = ParseOnly(
        RFTModule, PromptDataModule, args=["validate", "--config", str(GRPO_TINY)], auto_configure_optimizers=False
    )
    assert set(cli._subcommand_parsers) == {"validate"}
    with pytest.raises(SystemExit):
        cli_main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "lit-entropy fit: train a policy" in out and "--model.sampling.num_samples" in out


def test_fit_without_a_config_has_a_sane_budget(tmp_path, monkeypatch):
    from lit_entropy.cli.preflight import DEFAULT_MAX_EPOCHS

    monkeypatch.chdir(tmp_path)
    assert cli_main([], run=False).trainer.max_epochs == DEFAULT_MAX_EPOCHS == 3  # not Lightning's 1000
    steps = cli_main(["--trainer.max_steps=5"], run=False).trainer
    assert steps.max_steps == 5 and steps.max_epochs in (None, -1)  # a budget given is left alone


def test_callbacks_by_short_class_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["--config", str(GRPO_TINY), "--trainer.callbacks+=EntropyDiscriminatorClipping"]
    cli = cli_main([*args, "--trainer.callbacks.method=clip_v", "--trainer.callbacks.mu=3"], run=False)
    clip = [cb for cb in cli.trainer.callbacks if isinstance(cb, EntropyDiscriminatorClipping)]
    assert [(cb.method, cb.mu) for cb in clip] == [("clip_v", 3.0)]


def test_a_callback_argument_error_is_one_line(tmp_path, monkeypatch, capsys):
    from lit_entropy.cli import main

    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(GRPO_TINY), "--trainer.callbacks+=EntropyDiscriminatorClipping"]
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--trainer.callbacks.mu=0"])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-entropy")]
    line = "trainer.callbacks (EntropyDiscriminatorClipping): mu must be a finite number > 0, got 0.0"
    assert err == [f"lit-entropy: error: {line}"]


def _tiny_fit(tmp_path, *extra, version=None):
    args = ["fit", "--config", str(GRPO_TINY), *SHORT_FIT, "--trainer.max_steps=2", "--trainer.val_check_interval=2"]
    if version is not None:
        args.append(f"--trainer.logger.init_args.version={version}")
    return cli_main([*args, *extra])


def test_reusing_a_log_version_is_refused_without_touching_the_previous_run(tmp_path, monkeypatch):
    from lit_entropy.cli import SettingsError

    monkeypatch.chdir(tmp_path)
    _tiny_fit(tmp_path, version="v0")
    run = tmp_path / "runs" / "grpo_tiny" / "v0"
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "events" not in p.name}
    assert run / "config.yaml" in before and (run / "hf_model").is_dir()
    message = r"^trainer.logger.init_args.version: the log directory .*runs/grpo_tiny/v0 already holds a previous run"
    message += r" \(config.yaml, hf_model\).*--overwrite_run true"
    with pytest.raises(SettingsError, match=message):
        _tiny_fit(tmp_path, "--model.optim.lr=0.1", version="v0")
    after = {p: p.read_bytes() for p in run.rglob("*") if p.is_file() and "events" not in p.name}
    assert after == before
    _tiny_fit(tmp_path, "--model.optim.lr=0.1", "--overwrite_run=true", version="v0")  # on purpose
    assert "lr: 0.1" in (run / "config.yaml").read_text()


def test_resume_with_changed_settings_is_refused_listing_each_difference(tmp_path, monkeypatch):
    """README rule: fit --ckpt_path refuses explicit settings that differ from the checkpoint's (unless
    --resume_with_changes true); validate honours them with a warning; unset settings come from the checkpoint."""
    import torch

    from lit_entropy.cli import SettingsError

    monkeypatch.chdir(tmp_path)
    _tiny_fit(tmp_path, "--model.optim.weight_decay=0.01")  # a setting grpo_tiny.yaml does not give
    last = tmp_path / "runs" / "grpo_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True, mmap=True)["global_step"] == 2  # the final step, not the last val
    first = tmp_path / "first.ckpt"  # the resumed runs below continue version_0 and replace its last.ckpt
    shutil.copy(last, first)
    more = ["--trainer.max_steps=3", f"--ckpt_path={last}"]
    message = (
        r"was trained with different settings: model.optim.lr: 0.0003 -> 0.001; model.sampling.max_new_tokens: 6 -> 4\."
    )
    with pytest.raises(SettingsError, match=message):
        _tiny_fit(tmp_path, *more, "--model.optim.lr=1e-3", "--model.sampling.max_new_tokens=4")
    with pytest.raises(SettingsError, match=r"data.batch_size: 16 -> 8"):
        _tiny_fit(tmp_path, *more, "--data.batch_size=8")
    # unchanged settings resume; weight_decay, not given here, comes from the checkpoint (not the default 0);
    # an export location cannot alter the trajectory and may change
    cli = _tiny_fit(tmp_path, *more, "--model.logging.export_dir=elsewhere")
    assert cli.trainer.global_step == 3 and cli.model.settings.optim.weight_decay == 0.01
    with pytest.warns(UserWarning, match=r"model.optim.lr: 0.0003 -> 0.001; model.sampling.max_new_tokens: 6 -> 4\."):
        args = [
            "--trainer.max_steps=4",
            f"--ckpt_path={last}",
            "--model.optim.lr=1e-3",
            "--model.sampling.max_new_tokens=4",
        ]
        cli = _tiny_fit(tmp_path, *args, "--resume_with_changes=true")
    assert cli.model.settings.optim.lr == 1e-3 and cli.model.settings.sampling.max_new_tokens == 4
    (tmp_path / "config.yaml").write_text("mine: 1\n")  # a user's file in the working directory
    validate = ["validate", "--config", str(GRPO_TINY), "--trainer.logger=false", f"--ckpt_path={first}"]
    with pytest.warns(
        UserWarning, match=r"model.evaluation.num_samples: 8 -> 4\. The checkpoint's weights are evaluated"
    ):
        cli = cli_main([*validate, *SHORT_FIT[1:], "--model.evaluation.num_samples=4"])
    assert "val/avg@4" in cli.trainer.callback_metrics
    assert (tmp_path / "config.yaml").read_text() == "mine: 1\n"  # without a logger nothing is written here


def test_a_checkpoint_saved_under_renamed_keys_resumes_with_their_values(tmp_path, monkeypatch):
    """A checkpoint whose hparams hold ``update.fuse_old_logprob_pass`` / ``policy.fused_lm_head`` (saved before
    the rename) resumes through the CLI and loads with ``load_from_checkpoint``, the values under today's keys."""
    import torch

    monkeypatch.chdir(tmp_path)
    _tiny_fit(tmp_path, "--model.update.reuse_statistics_forward=false", "--model.policy.blockwise_lm_head=false")
    last = tmp_path / "runs" / "grpo_tiny" / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint = torch.load(last, weights_only=True)
    hparams = checkpoint["hyper_parameters"]
    hparams["update"]["fuse_old_logprob_pass"] = hparams["update"].pop("reuse_statistics_forward")
    hparams["policy"]["fused_lm_head"] = hparams["policy"].pop("blockwise_lm_head")
    old = tmp_path / "old.ckpt"
    torch.save(checkpoint, old)
    # Not given again: the (non-default) values come from the checkpoint's old keys.
    cli = _tiny_fit(tmp_path, "--trainer.max_steps=3", f"--ckpt_path={old}")
    assert cli.trainer.global_step == 3
    settings = cli.model.settings
    assert settings.update.reuse_statistics_forward is False and settings.policy.blockwise_lm_head is False
    loaded = RFTModule.load_from_checkpoint(old).settings
    assert loaded.update.reuse_statistics_forward is False and loaded.policy.blockwise_lm_head is False


def test_a_bad_model_path_is_one_line_before_anything_loads(tmp_path, monkeypatch, capsys):
    from lit_entropy.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "last.ckpt").write_bytes(b"not a model")
    with pytest.raises(SystemExit) as exit_info:
        main(["validate", "--config", str(GRPO_TINY), "--model.policy.model_name_or_path=last.ckpt"])
    assert exit_info.value.code == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-entropy")]
    assert len(err) == 1
    assert err[0].startswith(
        "lit-entropy: error: model.policy.model_name_or_path='last.ckpt' is a Lightning checkpoint"
    )

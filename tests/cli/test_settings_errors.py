"""Issue 20 §9: every settings mistake a user can make ends in ONE line, ``lit-entropy: error: <dotted key>: ...``,
naming today's dotted key and the value given, with exit status 2 and no traceback."""

from __future__ import annotations

import os
from pathlib import Path

import lightning  # noqa: F401
import pytest

from lit_entropy.cli import main
from lit_entropy.cli.parse_errors import explain_parse_error

# `lightning` is imported above, outside any test: the CLI imports it lazily, and imported inside a test its
# log handler would keep that test's capsys stream, closed afterwards ("--- Logging error ---" in later tests).
GRPO_TINY = Path(__file__).parents[2] / "configs" / "grpo_tiny.yaml"
# Should a case not fail, it must not train for long or write anywhere.
SAFE = ["--trainer.logger=false", "--trainer.max_steps=1", "--val_before_train=false", "--trainer.limit_val_batches=0"]
CLIP = "--trainer.callbacks+=EntropyDiscriminatorClipping"

# (id, extra arguments, config file text or None, the exact line after "lit-entropy: error: " or None,
#  substrings the line must hold: the dotted key and the value)
CASES = [
    ("nested float", ["--model.sampling.temperature=hot"], None,
     "model.sampling.temperature: expected a float, got 'hot'", []),
    ("nested int", ["--model.update.epochs=1.5"], None, "model.update.epochs: expected an integer, got 1.5", []),
    ("data int", ["--data.batch_size=abc"], None, "data.batch_size: expected an integer, got 'abc'", []),
    ("literal", ["--model.policy.dtype=float64"], None,
     "model.policy.dtype: expected one of 'auto', 'float32', 'bfloat16', 'float16', got 'float64'", []),
    ("algorithm", ["--model.algorithm=dpo"], None, "model.algorithm: expected one of 'grpo', 'ppo', got 'dpo'", []),
    ("optional list", ["--model.evaluation.pass_k=abc"], None,
     "model.evaluation.pass_k: expected a list of integers or null, got 'abc'", []),
    ("optional group field", ["--model.ppo.gamma=abc"], None, "model.ppo.gamma: expected a float, got 'abc'", []),
    ("trainer union", ["--trainer.precision=17"], None, None, ["trainer.precision: expected one of", "'bf16-mixed'",
                                                               "got 17"]),
    ("typo", ["--model.sampling.temprature=1.0"], None,
     "model.sampling.temprature: no such setting (did you mean model.sampling.temperature?), got 1.0", []),
    ("typo in group", ["--model.samp.temperature=1.0"], None,
     "model.samp.temperature: no such setting (did you mean model.sampling.temperature?), got 1.0", []),
    ("abbreviation", ["--trainer.max_step=3"], None,
     "trainer.max_step: no such setting (did you mean trainer.max_steps?), got 3", []),
    ("old name misspelt", ["--model.group_sze=3"], None,
     "model.group_sze: no such setting (did you mean model.sampling.num_samples?), got 3", []),
    ("old name", ["--model.dual_clip_c=3"], None, None, ["model.dual_clip_c -> model.loss.clip_ratio_c"]),
    ("config typo", [], "model:\n  sampling:\n    temprature: 1.0\n",
     "model.sampling.temprature: no such setting (did you mean model.sampling.temperature?)", []),
    ("config old key", [], "model:\n  group_size: 8\n", None, ["model.group_size -> model.sampling.num_samples"]),
    ("config nested type", [], "model:\n  sampling:\n    temperature: hot\n",
     "model.sampling.temperature: expected a float, got 'hot'", []),
    ("missing config", ["--config=nonexistent.yaml"], None, None, ["config: File does not exist", "nonexistent.yaml"]),
    ("rollout no import", ["--model.rollout=no.such.Engine"], None, None,
     ["model.rollout: expected the class_path of a lit_entropy.rollout.RolloutEngine subclass", "No module named 'no'",
      "got 'no.such.Engine'"]),
    ("rollout wrong kind", ["--model.rollout=torch.nn.Linear"], None,
     "model.rollout: expected the class_path of a lit_entropy.rollout.RolloutEngine subclass; torch.nn.Linear is not "
     "one, got 'torch.nn.Linear'", []),
    ("rollout unknown argument", ["--model.rollout=lit_entropy.rollout.HFRolloutEngine",
                                  "--model.rollout.init_args.eos_token=3"], None,
     "model.rollout.init_args.eos_token (HFRolloutEngine): no such argument (did you mean eos_token_id?), got 3", []),
    ("rollout constructor", ["--model.rollout=lit_entropy.rollout.VLLMRolloutEngine",
                             "--model.rollout.init_args.max_model_len=0"], None, None,
     ["model.rollout (VLLMRolloutEngine): max_model_len", "got 0"]),
    ("optimizer no import", ["--model.optim.optimizer=torch.optim.NoSuch"], None, None,
     ["model.optim.optimizer: expected the class_path of a torch.optim.Optimizer subclass", "NoSuch",
      "got 'torch.optim.NoSuch'"]),
    ("optimizer wrong kind", ["--model.optim.optimizer=torch.nn.Linear"], None,
     "model.optim.optimizer: expected the class_path of a torch.optim.Optimizer subclass; torch.nn.Linear is not one, "
     "got 'torch.nn.Linear'", []),
    ("optimizer argument type", ["--model.optim.optimizer=torch.optim.SGD", "--model.optim.optimizer.lr=abc"], None,
     None, ["model.optim.optimizer.init_args.lr (SGD): expected a float", "got 'abc'"]),
    ("optimizer unknown argument", ["--model.optim.optimizer=torch.optim.SGD", "--model.optim.optimizer.lrr=1"], None,
     "model.optim.optimizer.init_args.lrr (SGD): no such argument (did you mean lr?), got 1", []),
    ("callback no import", ["--trainer.callbacks+=no.such.Callback"], None, None,
     ["trainer.callbacks: expected the class_path of a lightning.Callback subclass", "got 'no.such.Callback'"]),
    ("callback wrong kind", ["--trainer.callbacks+=torch.nn.Linear"], None,
     "trainer.callbacks: expected the class_path of a lightning.Callback subclass; torch.nn.Linear is not one, "
     "got 'torch.nn.Linear'", []),
    ("callback unknown short name", ["--trainer.callbacks+=RandomTokenMasking"], None, None,
     ["trainer.callbacks:", "(did you mean RandomNegativeMasking?)", "got 'RandomTokenMasking'"]),
    ("callback argument type", [CLIP, "--trainer.callbacks.mu=abc"], None,
     "trainer.callbacks.init_args.mu (EntropyDiscriminatorClipping): expected a float or null, got 'abc'", []),
    ("callback unknown argument", [CLIP, "--trainer.callbacks.mux=0"], None,
     "trainer.callbacks.init_args.mux (EntropyDiscriminatorClipping): no such argument (did you mean mu?), got 0", []),
    ("callback constructor", [CLIP, "--trainer.callbacks.mu=0"], None, None,
     ["trainer.callbacks (EntropyDiscriminatorClipping): mu must be", "0"]),
    ("config callback argument", [],
     "trainer:\n  callbacks:\n    - class_path: EntropyDiscriminatorClipping\n      init_args:\n        mu: abc\n",
     "trainer.callbacks.init_args.mu (EntropyDiscriminatorClipping): expected a float or null, got 'abc'", []),
    ("settings check", ["--model.sampling.num_samples=1"], None,
     "model.sampling.num_samples must be >= 2 for grpo, got 1 "
     "(model.advantages.estimator='grpo' compares the samples of each prompt)", []),
    ("dual clip ignored", ["--model.loss.policy_loss=gspo", "--model.loss.clip_ratio_c=5"], None,
     "model.loss.clip_ratio_c=5.0 would be ignored: model.loss.policy_loss='gspo' has no dual clip (losses that "
     "apply it: ('ppo', 'dppo_tv', 'dppo_kl', 'ce_gppo')); leave model.loss.clip_ratio_c null or at its default 3.0, "
     "or pick one of those losses", []),
    ("max_gen_batches", ["--model.sampling.max_gen_batches=0"], None,
     "model.sampling.max_gen_batches must be an integer >= 1, got 0", []),
    ("filter a group of one", ["--model.sampling.filter_groups=true", "--model.sampling.num_samples=1"], None,
     "model.sampling.filter_groups=True needs model.sampling.num_samples >= 2, got 1 (the samples of a group of one "
     "always agree, so every group would be dropped)", []),
    ("group check", ["--model.algorithm=ppo", "--model.ppo.gamma=2"], None,
     "model.ppo.gamma must be a number in [0, 1], got 2.0", []),
    ("gradient clipping", ["--trainer.gradient_clip_val=1.0"], None, None,
     ["trainer.gradient_clip_val:", "model.optim.max_grad_norm", "got 1.0"]),
    ("accumulation", ["--trainer.accumulate_grad_batches=2"], None, None,
     ["trainer.accumulate_grad_batches:", "model.update.micro_batch_size", "got 2"]),
    ("reward", ["--model.reward.fn=no_such_reward"], None, None, ["model.reward.fn", "'no_such_reward'"]),
    ("missing value", ["--model.reward"], None, "model.reward: expected one argument", []),
    # Issue 35 §4: a reward module that is nowhere says where it was looked for and how to make it importable.
    ("reward module nowhere", ["--model.reward.fn=my_rewards_absent:score"], None, None,
     ["model.reward.fn: no module named 'my_rewards_absent', neither on sys.path nor in the working directory",
      "my_rewards_absent.py", "PYTHONPATH, got 'my_rewards_absent:score'"]),
    # Issue 35 §5: a negative number after a space is the value (argparse took -1e-4 for an option).
    ("negative number", ["--model.optim.lr", "-1e-4"], None,
     "model.optim.lr must be a finite number > 0 or null, got -0.0001", []),
    ("negative fraction", ["--model.loss.clip_ratio_low", "-.1"], None,
     "model.loss.clip_ratio_low must be a number in [0, 1), got -0.1", []),
]  # fmt: skip


@pytest.mark.parametrize(("args", "config", "line", "parts"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_settings_mistake_is_one_line_naming_the_key_and_the_value(args, config, line, parts, tmp_path,
                                                                      monkeypatch, capsys):  # fmt: skip
    monkeypatch.chdir(tmp_path)
    configs = ["--config", str(GRPO_TINY)]
    if config is not None:
        (tmp_path / "user.yaml").write_text(config)
        configs += ["--config", "user.yaml"]
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", *configs, *SAFE, *args])
    err = capsys.readouterr().err
    lines = [text for text in err.splitlines() if text.strip() and not text.startswith("Seed set to")]
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    prefix = "lit-entropy: error: "
    assert lines[0].startswith(prefix)
    if line is not None:
        assert lines[0] == prefix + line
    for part in parts:
        assert part in lines[0]


def test_every_union_dump_shape_is_read_back_into_one_line():
    """The message shapes jsonargparse 4.x writes (pinned here, so an upgrade that changes them fails one test)."""
    dump = (
        'Parser key "model.rollout":\n\n  - Expected a path but x.Y either not accessible or invalid\n'
        "  - Does not validate against any of the Union subtypes\n"
        "  Subtypes: [<class 'lit_entropy.rollout.base.RolloutEngine'>, <class 'NoneType'>]\n  Errors:\n"
        "    - Problem with given class_path 'x.Y':\n        No module named 'x'\n"
        "    - Expected a <class 'NoneType'>\n  Given value type: <class 'str'>\n  Given value: x.Y"
    )
    assert explain_parse_error(dump) == (
        "model.rollout: expected the class_path of a lit_entropy.rollout.RolloutEngine subclass; x.Y does not import "
        "(ModuleNotFoundError: No module named 'x'), got 'x.Y'"
    )
    assert explain_parse_error("unrecognized arguments: --a.b 3") == "a.b: no such setting, got 3"
    assert explain_parse_error("something\nelse") == "something else"


def test_a_failing_reward_function_is_one_line_naming_it_and_the_item(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_failing_rewards.py").write_text(
        "def score(completions, answers):\n    raise KeyError('no answer line in ' + completions[0][:5])\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(GRPO_TINY), *SAFE, "--model.reward.fn=my_failing_rewards:score"])
    err = capsys.readouterr().err
    lines = [text for text in err.splitlines() if text.startswith("lit-entropy")]
    assert exit_info.value.code == 1 and "Traceback" not in err and len(lines) == 1, err
    assert lines[0].startswith(
        "lit-entropy: error: model.reward.fn: reward function 'my_failing_rewards:score' raised KeyError: "
    )
    assert "on item 0 (prompt 0, sample 0: completion " in lines[0]
    assert lines[0].endswith("got 'my_failing_rewards:score'")


@pytest.mark.parametrize(
    ("args", "setting"),
    [
        (["--trainer.logger.init_args.save_dir=blocker/runs"], "trainer.logger.init_args.save_dir"),
        (["--model.logging.export_dir=blocker/export"], "model.logging.export_dir"),
        (["--model.logging.export_dir=blocker"], "model.logging.export_dir"),
        (
            ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.dirpath=blocker/ckpts"],
            "trainer.callbacks (ModelCheckpoint).init_args.dirpath",
        ),
    ],
    ids=["logger dir", "export dir", "export dir is a file", "checkpoint dir"],
)
def test_every_output_path_is_checked_before_the_first_step(args, setting, tmp_path, monkeypatch, capsys):
    """A file where a run directory must go is named before any model is loaded (the policy stays None)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "blocker").write_text("a user's file\n")
    loaded = []
    monkeypatch.setattr("lit_entropy.module.RFTModule.configure_model", lambda self: loaded.append(1))
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(GRPO_TINY), "--trainer.max_steps=1", *args])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("lit-entropy")]
    assert exit_info.value.code == 2 and len(err) == 1, err
    assert err[0].startswith(f"lit-entropy: error: {setting}: cannot write there ({tmp_path / 'blocker'} is a file")
    assert not loaded and (tmp_path / "blocker").read_text() == "a user's file\n"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root may write anywhere")
def test_a_read_only_log_directory_is_named(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(GRPO_TINY), "--trainer.max_steps=1", "--trainer.logger.init_args.save_dir=ro/x"])
    assert "trainer.logger.init_args.save_dir: cannot write there" in capsys.readouterr().err

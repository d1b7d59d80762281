"""Grouped settings: they accept exactly what the functional layer accepts, name the dotted setting on errors,
round-trip through checkpoints, and every pre-0.2 flat key points at a real new field."""

from __future__ import annotations

import dataclasses
import importlib
import math
import re
import sys

import pytest
import torch

from lit_entropy.functional import ADVANTAGE_SCALES, KL_KINDS, LOSS_AGG_MODES
from lit_entropy.rollout import SamplingConfig
from lit_entropy.settings import (
    LEGACY_MODEL_KEYS,
    RENAMED_MODEL_KEYS,
    AdvantageConfig,
    EvaluationConfig,
    LoggingConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    PPOConfig,
    RewardConfig,
    RFTSettings,
    RolloutCorrectionConfig,
    UpdateConfig,
    carry_over_renamed_keys,
    check_legacy_model_keys,
)

# The defining modules (imported by name: ``lit_entropy.functional.policy_loss`` was a module and a function).
advantages_module = importlib.import_module("lit_entropy.functional.advantages.grpo")
kl_module = importlib.import_module("lit_entropy.functional.losses.kl")
aggregation_module = importlib.import_module("lit_entropy.functional.losses.aggregation")

# Every name any functional constant knows, plus near misses: the settings must accept exactly their own list.
CANDIDATES = sorted({*LOSS_AGG_MODES, *KL_KINDS, *ADVANTAGE_SCALES, "token_mean", "K3", "k4", "seq-mean", "", "none "})


def _accepts(make) -> bool:
    try:
        make()
    except ValueError:
        return False
    return True


@pytest.mark.parametrize(
    ("constant", "make"),
    [
        (LOSS_AGG_MODES, lambda name: LossConfig(loss_agg_mode=name)),
        (KL_KINDS, lambda name: LossConfig(kl_type=name)),
        (ADVANTAGE_SCALES, lambda name: AdvantageConfig(scale=name)),
    ],
)
def test_settings_accept_exactly_the_functional_names(constant, make):
    accepted = {name for name in CANDIDATES if _accepts(lambda name=name: make(name))}
    assert accepted == set(constant)


@pytest.mark.parametrize(
    ("module", "attribute", "make"),
    [
        (aggregation_module, "LOSS_AGG_MODES", lambda: LossConfig(loss_agg_mode="my-mode")),
        (kl_module, "KL_KINDS", lambda: LossConfig(kl_type="k9")),
        (advantages_module, "ADVANTAGE_SCALES", lambda: AdvantageConfig(scale="rank")),
    ],
)
def test_a_name_added_to_the_functional_layer_needs_no_second_edit(monkeypatch, module, attribute, make):
    assert not _accepts(make)
    new_name = {"LOSS_AGG_MODES": "my-mode", "KL_KINDS": "k9", "ADVANTAGE_SCALES": "rank"}[attribute]
    # As if the defining line were edited: every module holding the constant (it is imported by name) sees it.
    original = getattr(module, attribute)
    for holder in [m for name, m in sys.modules.items() if name.startswith("lit_entropy.")]:
        if getattr(holder, attribute, None) is original:
            monkeypatch.setattr(holder, attribute, (*original, new_name))
    assert _accepts(make)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: PPOConfig(gamma=1.5), r"model.ppo.gamma must be a number in \[0, 1\], got 1.5"),
        (lambda: PPOConfig(lam=-0.1), r"model.ppo.lam must be a number in \[0, 1\], got -0.1"),
        (
            lambda: PPOConfig(clip_range_value=0.0),
            r"model.ppo.clip_range_value must be a finite number > 0 or null, got 0.0",
        ),
        (lambda: PPOConfig(clip_range_value=math.inf), r"model.ppo.clip_range_value .* got inf"),
        (lambda: PPOConfig(value_coef=-1.0), r"model.ppo.value_coef must be a finite number >= 0, got -1.0"),
        (lambda: LossConfig(clip_ratio_low=1.0), r"model.loss.clip_ratio_low must be a number in \[0, 1\), got 1.0"),
        (
            lambda: LossConfig(clip_ratio_high=-0.1),
            r"model.loss.clip_ratio_high must be a finite number >= 0, got -0.1",
        ),
        (lambda: LossConfig(clip_ratio_c=1.0), r"model.loss.clip_ratio_c must be a finite number > 1 or null, got 1.0"),
        (lambda: LossConfig(kl_coef=-0.1), r"model.loss.kl_coef must be a finite number >= 0, got -0.1"),
        (lambda: LossConfig(entropy_coef=math.nan), r"model.loss.entropy_coef must be a finite number >= 0, got nan"),
        (
            lambda: LossConfig(loss_scale_factor=0),
            r"model.loss.loss_scale_factor must be a finite number > 0 or null, got 0",
        ),
        (lambda: SamplingConfig(top_p=1.5), r"model.sampling.top_p must be a number in \(0, 1\], got 1.5"),
        (lambda: SamplingConfig(num_samples=2.5), r"model.sampling.num_samples must be an integer >= 1, got 2.5"),
        (
            lambda: EvaluationConfig(temperature=0),
            r"model.evaluation.temperature=0 \(greedy\) needs model.evaluation.num_samples=1, got 8",
        ),
        (lambda: SamplingConfig(temperature=0), r"model.sampling.temperature must be a number in \[0.01, 2\], got 0"),
        (
            lambda: SamplingConfig(temperature=2.5),
            r"model.sampling.temperature must be a number in \[0.01, 2\], got 2.5",
        ),
        (lambda: EvaluationConfig(temperature=3.0), r"model.evaluation.temperature must be .* got 3.0"),
        (lambda: EvaluationConfig(num_samples=4, pass_k=[8]), r"model.evaluation.pass_k \(K=4\) .* got 8"),
        (lambda: UpdateConfig(epochs=0), r"model.update.epochs must be an integer >= 1, got 0"),
        (lambda: OptimConfig(lr=0), r"model.optim.lr must be a finite number > 0 or null, got 0"),
        (lambda: OptimConfig(lr_schedule="step"), r"model.optim.lr_schedule must be one of .*got 'step'"),
        (lambda: PolicyConfig(dtype="int8"), r"model.policy.dtype must be one of .*got 'int8'"),
        (
            lambda: RolloutCorrectionConfig(level="token", upper=-1.0),
            r"model.loss.rollout_correction.upper must be a finite number > 0, got -1.0",
        ),
        (
            lambda: RolloutCorrectionConfig(mode="mask"),
            r"model.loss.rollout_correction.mode='mask' is set but the correction is off "
            r"\(model.loss.rollout_correction.level",
        ),
    ],
)
def test_out_of_range_settings_name_the_setting_and_the_value(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("estimator", "least"), [("grpo", 2), ("rloo", 2), ("reinforce_plus_plus_baseline", 2), ("reinforce_plus_plus", 1)]
)
def test_group_baseline_estimators_refuse_single_samples_before_training(estimator, least):
    groups = dict(policy=PolicyConfig(), sampling=SamplingConfig(num_samples=1), loss=LossConfig())
    groups.update(update=UpdateConfig(), optim=OptimConfig(), evaluation=EvaluationConfig(), ppo=None)
    groups.update(reward=RewardConfig(), logging=LoggingConfig(), algorithm="grpo")
    advantages = AdvantageConfig(estimator=estimator)
    if least == 1:  # a batch-normalised estimator has no group baseline: one sample per prompt is fine
        assert RFTSettings.build(**groups, advantages=advantages).advantages.estimator == estimator
        return
    message = rf"model.sampling.num_samples must be >= 2 for {estimator}, got 1 \(model.advantages.estimator="
    with pytest.raises(ValueError, match=message):
        RFTSettings.build(**groups, advantages=advantages)


def test_cross_group_rules():
    groups = dict(policy=PolicyConfig(), sampling=SamplingConfig(), advantages=AdvantageConfig(), loss=LossConfig())
    groups.update(update=UpdateConfig(), optim=OptimConfig(), evaluation=EvaluationConfig(), ppo=None)
    groups.update(reward=RewardConfig(), logging=LoggingConfig())
    with pytest.raises(ValueError, match=r"model.sampling.num_samples must be >= 2 for grpo, got 1"):
        RFTSettings.build(**{**groups, "algorithm": "grpo", "sampling": SamplingConfig(num_samples=1)})
    with pytest.raises(ValueError, match=r"model.ppo is set but model.algorithm is 'grpo'"):
        RFTSettings.build(**{**groups, "algorithm": "grpo", "ppo": PPOConfig()})
    ppo = RFTSettings.build(**{**groups, "algorithm": "ppo", "sampling": SamplingConfig(num_samples=1)})
    assert ppo.ppo == PPOConfig()  # PPO without its group gets the group's defaults


def test_a_custom_optimizer_and_lr_cannot_both_be_given():
    def sgd(params):
        return None

    assert OptimConfig(optimizer=sgd).adamw_lr == 1e-5  # unused, but the default is documented
    for kwargs in ({"lr": 1e-3}, {"weight_decay": 0.1}):
        with pytest.raises(ValueError, match=r"would be ignored: a custom model.optim.optimizer"):
            OptimConfig(optimizer=sgd, **kwargs)


def test_settings_round_trip_through_plain_checkpoint_data():
    settings = RFTSettings.build(
        policy=PolicyConfig("some/dir"),
        algorithm="ppo",
        sampling=SamplingConfig(num_samples=4),
        reward=RewardConfig(fn="math_verify"),
        advantages=AdvantageConfig(),
        loss=LossConfig(kl_coef=0.1),
        ppo=PPOConfig(gamma=0.9),
        update=UpdateConfig(epochs=2),
        optim=OptimConfig(warmup_steps=2, optimizer=lambda params: None),
        evaluation=EvaluationConfig(pass_k=[1, 4]),
        logging=LoggingConfig(export_dir="out"),
    )
    hparams = settings.to_hparams()
    assert all(isinstance(v, (dict, str, type(None))) for v in hparams.values())
    assert "optimizer" not in hparams["optim"]
    restored = RFTSettings.build(**hparams)
    assert restored.ppo == PPOConfig(gamma=0.9) and restored.evaluation.pass_k == [1, 4]
    assert dataclasses.replace(settings, optim=OptimConfig(warmup_steps=2)) == restored


def test_the_truncated_is_threshold_is_refused_and_carried_over_from_checkpoints():
    new = "model.loss.rollout_correction.upper (with level: token, mode: truncate)"
    for old in ({"advantages": {"rollout_is_threshold": 2.0}}, {"rollout_is_threshold": 2.0}):
        key = "advantages.rollout_is_threshold" if "advantages" in old else "rollout_is_threshold"
        with pytest.raises(ValueError, match=re.escape(f"model.{key} -> {new}")):
            check_legacy_model_keys(old, "old.yaml")
    saved = {"advantages": {"scale": "batch", "rollout_is_threshold": 3.0}}
    settings = RFTSettings.build(**carry_over_renamed_keys(saved))
    assert settings.advantages.scale == "batch" and saved["advantages"]["rollout_is_threshold"] == 3.0
    assert settings.loss.rollout_correction == RolloutCorrectionConfig(level="token", mode="truncate", upper=3.0)
    off = RFTSettings.build(**carry_over_renamed_keys({"advantages": {"rollout_is_threshold": None}}))
    assert not off.loss.rollout_correction.enabled


def test_the_rollout_correction_group_moved_into_loss():
    """``model.rollout_correction`` (a group of its own until issue 33) is refused in configs with its new place, and
    a checkpoint that stored it at the top carries it into ``model.loss``."""
    with pytest.raises(ValueError, match=re.escape("model.rollout_correction -> model.loss.rollout_correction")):
        check_legacy_model_keys({"rollout_correction": {"level": "token"}}, "old.yaml")
    saved = {"loss": {"kl_coef": 0.1}, "rollout_correction": {"level": "token", "upper": 3.0}}
    settings = RFTSettings.build(**saved)  # what load_from_checkpoint hands the module
    assert settings.loss.rollout_correction == RolloutCorrectionConfig(level="token", upper=3.0)
    assert settings.loss.kl_coef == 0.1 and saved["rollout_correction"] == {"level": "token", "upper": 3.0}
    assert RFTSettings.build(**settings.to_hparams()) == settings  # stored nested, read back nested


@pytest.mark.parametrize("group", ["multi_turn", "async_rollout"])
def test_the_rollout_mode_groups_moved_into_sampling(group):
    """``model.multi_turn`` / ``model.async_rollout`` (groups of their own until issue 33) are refused in configs with
    their new place in ``model.sampling``, and a checkpoint that stored them at the top carries them there."""
    with pytest.raises(ValueError, match=re.escape(f"model.{group} -> model.sampling.{group} ")):
        check_legacy_model_keys({group: {}}, "old.yaml")
    check_legacy_model_keys({"sampling": {group: {}}}, "new.yaml")
    value = {"tools": ["pkg.tools:add"], "max_turns": 2} if group == "multi_turn" else {"max_staleness": 0}
    saved = {"sampling": {"num_samples": 4}, group: value, "ppo": None}
    settings = RFTSettings.build(**saved)  # what a resumed run hands the module
    config = getattr(settings.sampling, group)
    assert dataclasses.asdict(config).items() >= value.items() and settings.sampling.num_samples == 4
    assert saved[group] == value and "multi_turn" not in saved["sampling"]  # the checkpoint's dict is left alone
    assert RFTSettings.build(**settings.to_hparams()) == settings  # stored nested, read back nested
    off = {"multi_turn": None, "async_rollout": None}  # what every older checkpoint stored when off
    assert RFTSettings.build(**off) == RFTSettings.build()


def test_async_rollouts_turn_the_staleness_correction_on_once():
    """A stale sample is weighed by default (token-level truncation at 2); the resolved correction is what HPARAMS
    store, so a checkpoint reads back the same settings."""
    from lit_entropy.async_rollout import STALENESS_CORRECTION, AsyncRolloutConfig

    stale = RFTSettings.build(sampling={"async_rollout": AsyncRolloutConfig(max_staleness=1)})
    assert stale.loss.rollout_correction == STALENESS_CORRECTION
    assert RFTSettings.build(**stale.to_hparams()) == stale
    for config in (AsyncRolloutConfig(max_staleness=0), AsyncRolloutConfig(max_staleness=1, correct_staleness=False)):
        assert not RFTSettings.build(sampling={"async_rollout": config}).loss.rollout_correction.enabled
    own = RolloutCorrectionConfig(level="sequence", mode="mask")
    kept = RFTSettings.build(sampling={"async_rollout": {"max_staleness": 1}}, loss=LossConfig(rollout_correction=own))
    assert kept.loss.rollout_correction == own
    assert not RFTSettings.build().loss.rollout_correction.enabled


def test_correction_refuses_a_policy_loss_without_token_weights():
    from lit_entropy.functional.registry import POLICY_LOSSES, register_policy_loss

    @register_policy_loss("test_unweighted")
    def unweighted(logprobs, old_logprobs, advantages, mask, **extra):
        raise AssertionError("not called")

    try:
        RFTSettings.build(loss=LossConfig(policy_loss="test_unweighted"))  # fine without correction
        with pytest.raises(ValueError, match="model.loss.policy_loss='test_unweighted' takes no token_weights"):
            LossConfig(policy_loss="test_unweighted", rollout_correction=RolloutCorrectionConfig(level="token"))
    finally:
        POLICY_LOSSES.unregister("test_unweighted")


def test_every_legacy_key_points_at_an_existing_setting():
    from lit_entropy.settings import _GROUP_TYPES

    for old, new in LEGACY_MODEL_KEYS.items():
        path = new.split(" ")[0].split(".")
        assert path[0] == "model", old
        if len(path) == 2:  # a whole group (model.rollout)
            assert path[1] == "rollout", old
            continue
        group = _GROUP_TYPES[path[1]]
        assert path[2] in {f.name for f in dataclasses.fields(group)}, (old, new)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"update": {"fuse_old_logprob_pass": False}},
            "model.update.fuse_old_logprob_pass -> model.update.reuse_statistics_forward",
        ),
        ({"policy": {"fused_lm_head": True}}, "model.policy.fused_lm_head -> model.policy.blockwise_lm_head"),
        ({"fuse_old_logprob_pass": True}, "model.fuse_old_logprob_pass -> model.update.reuse_statistics_forward"),
    ],
)
def test_renamed_keys_are_refused_with_their_new_dotted_name(settings, message):
    with pytest.raises(ValueError, match=rf"^old.yaml uses setting names that lit_entropy replaced: {message} "):
        check_legacy_model_keys(settings, "old.yaml")
    # The same leaf name under another group is not an old key.
    check_legacy_model_keys({"loss": {"fused_lm_head": 1}, "update": {"epochs": 1}}, "new.yaml")


def test_checkpoint_hparams_under_renamed_keys_carry_their_values_over():
    saved = {"policy": {"fused_lm_head": False, "dtype": "float32"}, "update": {"fuse_old_logprob_pass": False}}
    moved = carry_over_renamed_keys(saved)
    assert moved == {
        "policy": {"blockwise_lm_head": False, "dtype": "float32"},
        "update": {"reuse_statistics_forward": False},
    }
    assert saved["update"] == {"fuse_old_logprob_pass": False}, "the checkpoint's own dict is left as it was"
    settings = RFTSettings.build(**saved)  # what load_from_checkpoint hands the module
    assert settings.policy.blockwise_lm_head is False and settings.update.reuse_statistics_forward is False
    assert settings == RFTSettings.build(**moved)
    for old, new in RENAMED_MODEL_KEYS.items():
        assert LEGACY_MODEL_KEYS[old] == f"model.{new}"


@pytest.mark.parametrize("loss", ["gspo", "gmpo"])
def test_a_sequence_advantage_loss_is_refused_with_a_critic_naming_both_settings(loss):
    with pytest.raises(ValueError) as error:
        RFTSettings.build(algorithm="ppo", ppo=PPOConfig(), loss=LossConfig(policy_loss=loss))
    message = str(error.value)
    assert "\n" not in message
    assert f"model.loss.policy_loss={loss!r}" in message and "model.advantages.estimator='gae'" in message
    for fine in ("ppo", "gspo_token", "cispo"):  # per-token losses take the critic's per-token advantages
        RFTSettings.build(algorithm="ppo", ppo=PPOConfig(), loss=LossConfig(policy_loss=fine))


@pytest.mark.parametrize(
    ("loss", "mode"),
    [("ppo", "token-mean"), ("cispo", "token-mean"), ("gspo", "seq-mean-token-mean"),
     ("gspo_token", "seq-mean-token-mean"), ("gmpo", "seq-mean-token-mean")],
)  # fmt: skip
def test_a_null_loss_agg_mode_is_the_policy_loss_papers_and_a_set_one_is_kept(loss, mode):
    assert LossConfig(policy_loss=loss).loss_agg_mode == mode  # GSPO / GMPO: each sequence counts once
    assert RFTSettings.build(loss=LossConfig(policy_loss=loss)).to_hparams()["loss"]["loss_agg_mode"] == mode
    assert LossConfig(policy_loss=loss, loss_agg_mode="token-sum").loss_agg_mode == "token-sum"


def _dual_clip_changes_the_loss(name: str) -> bool:
    """Whether the registered policy loss ``name`` computes another loss or gradient with a dual clip of 1.5 than
    without, on off-policy tokens where that clip binds (negative advantages, ratios up to e^2)."""
    import torch

    from lit_entropy.functional import POLICY_LOSSES

    generator = torch.Generator().manual_seed(0)
    old = torch.randn(6, 5, dtype=torch.float64, generator=generator)
    shift = torch.randn(6, 5, dtype=torch.float64, generator=generator)
    advantages = torch.tensor([-1.0, -0.5, 1.0, -2.0, 0.5, -1.0], dtype=torch.float64)[:, None].expand(6, 5)
    mask = torch.ones(6, 5, dtype=torch.bool)
    results = []
    for clip_ratio_c in (None, 1.5):
        logprobs = (old + shift).requires_grad_(True)
        loss, _ = POLICY_LOSSES[name](
            logprobs, old, advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.2, clip_ratio_c=clip_ratio_c,
            loss_agg_mode="token-mean", normalizer=None, loss_scale_factor=None, response_mask=mask,
        )  # fmt: skip
        (grad,) = torch.autograd.grad(loss, logprobs)
        results.append((loss.detach(), grad))
    return not (torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1]))


def test_a_dual_clip_the_policy_loss_ignores_is_refused_naming_both_settings():
    from lit_entropy.functional import POLICY_LOSSES

    shipped = [name for name in POLICY_LOSSES.names() if POLICY_LOSSES[name].__module__.startswith("lit_entropy.")]
    applies = {name: _dual_clip_changes_the_loss(name) for name in shipped}
    assert applies["ppo"] and not applies["gspo"]  # both kinds are exercised
    for name, reads in applies.items():
        LossConfig(policy_loss=name)  # the default passes with every loss
        LossConfig(policy_loss=name, clip_ratio_c=None)
        if reads:
            assert LossConfig(policy_loss=name, clip_ratio_c=1.5).clip_ratio_c == 1.5
            continue
        with pytest.raises(ValueError) as error:
            LossConfig(policy_loss=name, clip_ratio_c=1.5)
        message = str(error.value)
        assert "\n" not in message
        assert message.startswith(f"model.loss.clip_ratio_c=1.5 would be ignored: model.loss.policy_loss={name!r}")


def test_policy_loss_options_reach_only_a_loss_that_takes_them():
    from lit_entropy.settings import LossConfig

    assert LossConfig(policy_loss="sapo", policy_loss_options={"tau_neg": 2.0}).policy_loss_options == {"tau_neg": 2.0}
    assert LossConfig(policy_loss="ce_gppo", policy_loss_options={"beta1": 0.5, "beta2": 1}).policy_loss_options
    with pytest.raises(ValueError, match=r"has 'tau', which model.loss.policy_loss='sapo' does not take \(its options: "
                       r"\['tau_neg', 'tau_pos'\]\)"):  # fmt: skip
        LossConfig(policy_loss="sapo", policy_loss_options={"tau": 2.0})
    with pytest.raises(
        ValueError, match=r"'beta1', which model.loss.policy_loss='ppo' does not take \(its options: none"
    ):
        LossConfig(policy_loss="ppo", policy_loss_options={"beta1": 0.5})
    with pytest.raises(ValueError, match=r"model.loss.policy_loss_options.tau_neg must be a finite number, got nan"):
        LossConfig(policy_loss="sapo", policy_loss_options={"tau_neg": float("nan")})
    with pytest.raises(ValueError, match=r"tau_neg must be a finite number > 0, got -1.0"):  # the loss's own check
        from lit_entropy.functional import POLICY_LOSSES

        z = torch.zeros(2, 3)
        POLICY_LOSSES["sapo"](z, z, z, z.bool(), clip_ratio_low=0.2, clip_ratio_high=0.2, tau_neg=-1.0)

"""``--ckpt_path``: which explicit settings count as a change against the checkpoint's."""

from __future__ import annotations

from lit_entropy.cli.resume import explicit_changes


def test_a_default_null_for_a_setting_the_checkpoint_does_not_record_is_no_change():
    """A run's own config.yaml writes ``optimizer: null`` / ``rollout: null``; the checkpoint omits them."""
    saved = {"optim": {"lr": 3e-4, "weight_decay": None}, "sampling": {"num_samples": 8}}
    given = {"optim": {"lr": 0.0003, "weight_decay": None, "optimizer": None}, "rollout": None}
    assert explicit_changes(saved, given, "model") == []


def test_real_differences_are_listed_by_dotted_key():
    saved = {"optim": {"lr": 3e-4, "weight_decay": None}, "sampling": {"num_samples": 8}}
    given = {
        "optim": {"lr": 1e-3, "weight_decay": 0.01, "optimizer": "torch.optim.SGD"},
        "sampling": {"num_samples": 8},
    }
    changes = [(key, repr(old), new) for key, old, new in explicit_changes(saved, given, "model")]
    assert changes == [
        ("model.optim.lr", "0.0003", 1e-3),
        ("model.optim.optimizer", "<unset>", "torch.optim.SGD"),
        ("model.optim.weight_decay", "None", 0.01),
    ]


def _changes(saved: dict, given: dict) -> list:
    from lit_entropy.cli.resume import resolve_null_estimator

    resolve_null_estimator(saved, given)
    return [(key, old, new) for key, old, new in explicit_changes(saved, given, "model")]


def test_a_null_estimator_and_the_algorithms_default_are_the_same_setting():
    # checkpoints store the resolved name, a run's config.yaml keeps the null it was given
    assert (
        _changes({"algorithm": "grpo", "advantages": {"estimator": "grpo"}}, {"advantages": {"estimator": None}}) == []
    )
    # checkpoints from before the registries store no estimator: they ran the algorithm's default
    assert _changes({"algorithm": "ppo", "advantages": {"scale": "std"}}, {"advantages": {"estimator": "gae"}}) == []
    assert _changes({"advantages": {}}, {"advantages": {"estimator": "grpo"}}) == []


def test_a_different_estimator_is_still_a_change():
    assert _changes(
        {"algorithm": "grpo", "advantages": {"estimator": "grpo"}}, {"advantages": {"estimator": "rloo"}}
    ) == [("model.advantages.estimator", "grpo", "rloo")]
    # a null under a changed algorithm resolves to that algorithm's default
    saved = {"algorithm": "grpo", "advantages": {"estimator": "grpo"}}
    assert _changes(saved, {"algorithm": "ppo", "advantages": {"estimator": None}}) == [
        ("model.advantages.estimator", "grpo", "gae"),
        ("model.algorithm", "grpo", "ppo"),
    ]


def _loss_changes(saved: dict, given: dict) -> list:
    from lit_entropy.cli.resume import resolve_null_loss_agg_mode

    resolve_null_loss_agg_mode(saved, given)
    return explicit_changes(saved, given, "model")


def test_a_null_loss_agg_mode_and_the_losss_default_are_the_same_setting():
    # checkpoints store the resolved mode, a run's config.yaml keeps the null it was given
    saved = {"loss": {"policy_loss": "gspo", "loss_agg_mode": "seq-mean-token-mean"}}
    assert _loss_changes(saved, {"loss": {"loss_agg_mode": None}}) == []
    assert _loss_changes({"loss": {"loss_agg_mode": "token-mean"}}, {"loss": {"loss_agg_mode": None}}) == []
    # a gspo run from before the default followed the paper ran token-mean: resuming with the null is a change
    old = {"loss": {"policy_loss": "gspo", "loss_agg_mode": "token-mean"}}
    assert _loss_changes(old, {"loss": {"loss_agg_mode": None}}) == [
        ("model.loss.loss_agg_mode", "token-mean", "seq-mean-token-mean")
    ]

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

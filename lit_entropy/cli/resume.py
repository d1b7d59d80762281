"""``--ckpt_path``: compare the settings given with the checkpoint's, and read them without loading its tensors."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from lit_entropy.checkpointing.fingerprint import CHECKPOINT_KEY as FINGERPRINT_KEY
from lit_entropy.checkpointing.fingerprint import fingerprint_change
from lit_entropy.cli.errors import SettingsError
from lit_entropy.functional.registry import POLICY_LOSSES, default_loss_agg_mode
from lit_entropy.reporting.steps import checkpoint_log_dir, checkpoint_trained_batches
from lit_entropy.settings import DEFAULT_ESTIMATORS, carry_over_renamed_keys

__all__ = [
    "RESUME_SAFE_KEYS",
    "check_data_unchanged",
    "check_same_weights_layout",
    "deep_merge",
    "explicit_changes",
    "read_checkpoint_hparams",
    "report_setting_changes",
    "resolve_null_loss_agg_mode",
]


#: Settings whose change on resume cannot alter the training trajectory (outputs and logging only).
RESUME_SAFE_KEYS = frozenset(
    {
        "export_dir",
        "export_on_train_end",
        "log_samples_every_n_steps",
        "num_logged_samples",
        "num_workers",
        "cache_dir",
    }
)


def explicit_changes(saved: Any, explicit: Any, prefix: str) -> list[tuple[str, Any, Any]]:
    """Settings given explicitly (``explicit``, nested) whose value differs from the checkpoint's (``saved``).

    Returns ``(dotted key, old, new)`` sorted by key; nested dicts (grouped settings, ``class_path`` /
    ``init_args``) are compared key by key, a key the checkpoint lacks shows as ``<unset>``; ``None`` for a
    key the checkpoint lacks is no change: it is the default of the settings a checkpoint does not record
    when unset (``model.optim.optimizer``, ``model.rollout``), which a run's ``config.yaml`` writes as
    ``null``. The leaf names in :data:`RESUME_SAFE_KEYS` are skipped: they cannot alter the training
    trajectory.
    """
    out: list[tuple[str, Any, Any]] = []
    if not isinstance(explicit, Mapping):
        return out
    saved = saved if isinstance(saved, Mapping) else {}
    for key in sorted(explicit, key=str):
        if str(key) in RESUME_SAFE_KEYS or str(key).startswith("_"):
            continue
        name = f"{prefix}.{key}"
        old, new = saved.get(key, _UNSET), explicit[key]
        if old is _UNSET and new is None:
            continue
        if isinstance(new, Mapping) and isinstance(old, Mapping):
            out += explicit_changes(old, new, name)
        elif _plain(old) != _plain(new):
            out.append((name, old, new))
    return out


def resolve_null_estimator(saved_model: dict[str, Any], explicit_model: dict[str, Any]) -> None:
    """Write the algorithm's default estimator where either side leaves ``model.advantages.estimator`` null.

    The settings resolve a null estimator to :data:`~lit_entropy.settings.DEFAULT_ESTIMATORS` of the
    algorithm and checkpoints store the resolved name, while a run's ``config.yaml`` keeps the null it was
    given; checkpoints from before the registries store no estimator at all. Both mean the same estimator,
    so neither is a change on resume. Edits the dicts in place (``explicit_model`` only where it sets the key).
    """
    old_algorithm = saved_model.get("algorithm", "grpo")
    new_algorithm = explicit_model.get("algorithm", old_algorithm)
    saved_adv = saved_model.get("advantages")
    if isinstance(saved_adv, dict) and saved_adv.get("estimator") is None and old_algorithm in DEFAULT_ESTIMATORS:
        saved_adv["estimator"] = DEFAULT_ESTIMATORS[old_algorithm]
    given_adv = explicit_model.get("advantages")
    if isinstance(given_adv, dict) and "estimator" in given_adv and given_adv["estimator"] is None:
        if new_algorithm in DEFAULT_ESTIMATORS:
            given_adv["estimator"] = DEFAULT_ESTIMATORS[new_algorithm]


def resolve_null_loss_agg_mode(saved_model: dict[str, Any], explicit_model: dict[str, Any]) -> None:
    """Write the policy loss's own aggregation where the settings given leave ``model.loss.loss_agg_mode`` null.

    A null mode means the policy loss's paper's (``lit_entropy.functional.default_loss_agg_mode``) and checkpoints
    store the resolved mode, while a run's ``config.yaml`` keeps the null: the same setting, no change on resume.
    The loss is the one given, else the checkpoint's (``ppo`` when it records none). Edits ``explicit_model``.
    """
    given = explicit_model.get("loss")
    if not (isinstance(given, dict) and "loss_agg_mode" in given and given["loss_agg_mode"] is None):
        return
    saved_loss = saved_model.get("loss")
    if not isinstance(saved_loss, dict):
        saved_loss = {}
    name = given.get("policy_loss") or saved_loss.get("policy_loss") or "ppo"
    if name in POLICY_LOSSES:
        given["loss_agg_mode"] = default_loss_agg_mode(name)


def report_setting_changes(
    ckpt_path: str | Path, changes: list[tuple[str, Any, Any]], subcommand: str, *, allow_changes: bool
) -> None:
    """Refuse (``fit`` without ``--resume_with_changes``) or warn about settings that differ from a checkpoint's.

    A resumed ``fit`` restores the weights, the optimizer (with its learning rate) and the LR schedule, so a
    changed setting would be honoured only partly; ``validate`` / ``test`` use the checkpoint's weights
    with the settings given.
    """
    if not changes:
        return
    listing = "; ".join(f"{key}: {old!r} -> {new!r}" for key, old, new in changes)
    if not allow_changes:
        raise SettingsError(
            f"--ckpt_path={str(ckpt_path)!r} was trained with different settings: {listing}. Resume with the "
            "checkpoint's settings (drop these overrides, or use --config <its log dir>/config.yaml), pass "
            "--resume_with_changes true to resume with the new values anyway, or start a new run from an "
            "exported model"
        )
    note = (
        " The weights, the optimizer state (including its learning rate) and the LR schedule come from the checkpoint."
        if subcommand == "fit"
        else " The checkpoint's weights are evaluated with the settings given."
    )
    warnings.warn(
        f"{subcommand} --ckpt_path {ckpt_path}: settings differ from the checkpoint's and the new values are used: "
        f"{listing}.{note}",
        UserWarning,
        stacklevel=2,
    )


def deep_merge(base: Any, override: Any) -> Any:
    if isinstance(base, Mapping) and isinstance(override, Mapping):
        merged = dict(base)
        for key, value in override.items():
            merged[key] = deep_merge(base.get(key), value)
        return merged
    return override


def check_data_unchanged(ckpt_path: str | Path, saved: dict[str, Any] | None, spec: Any, *, allow: bool) -> None:
    """Refuse (or with ``allow`` warn about) training data that changed since the checkpoint was written."""
    change = fingerprint_change(saved, spec)
    if change is None:
        return
    if not allow:
        raise SettingsError(
            f"data.train_dataset: {change} ({ckpt_path}); resuming would skip batches by position in different "
            "data. Restore the file, start a new run, or pass --resume_with_changes true to resume on it anyway"
        )
    warnings.warn(f"data.train_dataset: {change}; resuming on the new data (--resume_with_changes)", stacklevel=2)


def check_same_weights_layout(ckpt_path: str | Path, lora_weights: bool | None, lora_setting: Any) -> None:
    """Refuse a resume whose settings build other weights than the checkpoint holds (LoRA adapters vs a full model).

    ``--resume_with_changes`` honours settings that change the training, not the parameters: the restore
    would fail inside ``fit`` with a list of missing and unexpected keys, after the run directory was written.
    """
    if lora_weights is None:
        return
    wants_lora = lora_setting is not None
    if wants_lora == lora_weights:
        return
    held, built = ("LoRA adapters", "a full model") if lora_weights else ("full-model weights", "LoRA adapters")
    raise SettingsError(
        f"model.policy.lora: {ckpt_path} holds {held} but these settings train {built}; a resume cannot change "
        "the weights a checkpoint holds, even with --resume_with_changes. Resume with the checkpoint's "
        "model.policy.lora, or start a new run from its exported policy (lit-entropy export --ckpt_path "
        f"{ckpt_path} --out DIR, then --model.policy.model_name_or_path DIR)"
    )


class _Unset:
    def __repr__(self) -> str:
        return "<unset>"


_UNSET = _Unset()


def _plain(value: Any) -> Any:
    """Comparable form: tuples as lists, numbers by value (so 3e-4 == 0.0003 and 1 == 1.0)."""
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    return value


def read_checkpoint_hparams(ckpt_path: str | Path) -> dict[str, Any]:
    """``{"model": ..., "data": ...}`` hyper-parameters stored in a checkpoint, its ``"trained_batches"`` (the step
    it was written at) and ``"log_dir"`` (its run's directory, or None), without reading its tensors.

    A consolidated file is memory-mapped (a 7B checkpoint costs no RAM); a sharded directory's ``meta.pt``
    is read. Missing sections are empty dicts; model settings saved under a renamed key are moved to today's
    (:func:`lit_entropy.settings.carry_over_renamed_keys`).
    """
    path = Path(ckpt_path)
    if not path.exists():
        raise SettingsError(f"--ckpt_path={str(ckpt_path)!r} does not exist")
    source = path / "meta.pt" if path.is_dir() else path
    if not source.is_file():
        raise SettingsError(
            f"--ckpt_path={str(ckpt_path)!r} is a directory without meta.pt, not a Lightning checkpoint"
        )
    try:
        checkpoint = torch.load(source, map_location="cpu", mmap=True, weights_only=True)
    except Exception as err:  # truncated file, not a checkpoint, ...
        raise SettingsError(
            f"--ckpt_path={str(ckpt_path)!r} cannot be read as a checkpoint ({type(err).__name__}: {err})"
        ) from err

    return {
        # A checkpoint saved before a setting was renamed resumes with the value under today's key.
        "model": carry_over_renamed_keys(checkpoint.get("hyper_parameters") or {}),
        "data": dict(checkpoint.get("datamodule_hyper_parameters") or {}),
        "trained_batches": checkpoint_trained_batches(checkpoint),
        "log_dir": checkpoint_log_dir(checkpoint),
        "data_fingerprint": checkpoint.get(FINGERPRINT_KEY),
        # LoRA checkpoints hold the adapters only; None when the file has no state_dict (a sharded meta.pt)
        "lora_weights": (
            any("lora_" in str(key) for key in checkpoint["state_dict"]) if "state_dict" in checkpoint else None
        ),
    }

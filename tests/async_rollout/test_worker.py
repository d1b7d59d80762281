"""The rollout worker thread and ``model.sampling.async_rollout``'s settings, without a Trainer."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from lit_entropy.async_rollout import (
    STALENESS_CORRECTION,
    AsyncRolloutConfig,
    RolloutWorker,
    RolloutWorkerError,
    RolloutWorkerHung,
)
from lit_entropy.functional.sampling import sample_categorical, thread_generator
from lit_entropy.rollout.correction import RolloutCorrectionConfig


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_staleness": -1}, "model.sampling.async_rollout.max_staleness"),
        ({"max_inflight": 0}, "model.sampling.async_rollout.max_inflight"),
        ({"weight_sync_steps": 0}, "model.sampling.async_rollout.weight_sync_steps"),
        ({"worker_timeout_s": 0}, "model.sampling.async_rollout.worker_timeout_s"),
        ({"worker_threads": 0}, "model.sampling.async_rollout.worker_threads"),
        ({"max_staleness": 1, "max_inflight": 1, "weight_sync_steps": 2}, "weight_sync_steps=2"),
        ({"max_staleness": 3, "max_inflight": 2, "weight_sync_steps": 3}, "at most 2"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, message):
    with pytest.raises(ValueError, match=message):
        AsyncRolloutConfig(**kwargs)


def test_depth_and_sync_interval_keep_every_batch_within_the_bound():
    # depth + interval - 1 = the worst staleness (a batch sent just before a push, trained depth versions later).
    for staleness in range(4):
        for inflight in range(1, 4):
            config = AsyncRolloutConfig(max_staleness=staleness, max_inflight=inflight)
            assert config.depth == min(inflight, staleness)
            assert config.depth + config.max_sync_interval - 1 == staleness


def test_the_correction_is_on_by_default_only_for_stale_samples():
    off = RolloutCorrectionConfig()
    assert AsyncRolloutConfig(max_staleness=0).corrected(off) is off
    assert AsyncRolloutConfig(max_staleness=1).corrected(off) == STALENESS_CORRECTION
    assert AsyncRolloutConfig(max_staleness=1, correct_staleness=False).corrected(off) is off
    mine = RolloutCorrectionConfig(level="sequence", mode="mask", upper=3.0)
    assert AsyncRolloutConfig(max_staleness=2).corrected(mine) is mine


def test_results_come_in_order_with_the_version_loaded_before_them():
    loaded = []
    worker = RolloutWorker(lambda batch: batch * 10, lambda weights, version: loaded.append(weights), version=3)
    try:
        worker.submit(0, 1)
        worker.push("w4", 4)
        worker.submit(1, 2)
        first, second = worker.result(5.0), worker.result(5.0)
    finally:
        worker.close()
    assert (first.ticket, first.version, first.output) == (0, 3, 10)
    assert (second.ticket, second.version, second.output) == (1, 4, 20)
    assert loaded == ["w4"] and not worker.thread.is_alive()


def test_a_worker_that_raises_stops_the_trainer_with_its_own_error():
    def generate(batch):
        raise ValueError(f"engine broke on {batch}")

    worker = RolloutWorker(generate, lambda w, v: None)
    worker.submit(0, "prompts")
    start = time.monotonic()
    with pytest.raises(RolloutWorkerError, match="ValueError: engine broke on prompts") as caught:
        worker.result(60.0)
    assert time.monotonic() - start < 5.0
    assert isinstance(caught.value.__cause__, ValueError) and caught.value.__cause__.__traceback__ is not None
    worker.close()


def test_a_hung_worker_stops_the_trainer_after_the_timeout_with_its_stack():
    never = threading.Event()

    def generate_forever(batch):
        never.wait()  # a hung engine

    worker = RolloutWorker(generate_forever, lambda w, v: None)
    worker.submit(0, "prompts")
    start = time.monotonic()
    with pytest.raises(RolloutWorkerHung, match="worker_timeout_s=0.3") as caught:
        worker.result(0.3)
    assert 0.3 <= time.monotonic() - start < 5.0
    assert "generate_forever" in str(caught.value)  # where it hangs
    worker.close(timeout_s=0.1)  # returns although the thread is stuck (a daemon: it never holds the process)
    assert worker.thread.daemon
    never.set()


def test_the_worker_waits_for_commands_and_reports_how_long():
    worker = RolloutWorker(lambda batch: batch, lambda w, v: None)
    try:
        time.sleep(0.2)
        worker.submit(0, 1)
        worker.result(5.0)
        assert worker.take_wait() >= 0.15
        assert worker.take_wait() == 0.0
    finally:
        worker.close()


def test_a_thread_generator_belongs_to_its_thread():
    """The worker's sampling stream is its own: the trainer's thread keeps drawing from the global one."""
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    drawn = []

    def sample():
        with thread_generator(torch.Generator().manual_seed(5)):
            drawn.append(sample_categorical(torch.zeros(64, 100)))

    thread = threading.Thread(target=sample)
    thread.start()
    thread.join()
    assert torch.equal(torch.rand(3), expected)  # the global stream was not touched
    with thread_generator(torch.Generator().manual_seed(5)):
        assert torch.equal(sample_categorical(torch.zeros(64, 100)), drawn[0])


def test_an_engine_other_than_hf_generate_or_vllm_is_refused_before_training(tiny_model_dir):
    from lit_entropy.module import RFTModule
    from lit_entropy.rollout import RolloutEngine
    from lit_entropy.settings import PolicyConfig, TrainingSamplingConfig

    class CustomEngine(RolloutEngine):  # a user's own
        def generate(self, policy, input_ids, attention_mask, sampling):
            raise AssertionError("never called")

    sampling = TrainingSamplingConfig(async_rollout=AsyncRolloutConfig())
    with pytest.raises(ValueError, match="async_rollout needs model.rollout: null .* or a VLLMRolloutEngine"):
        RFTModule(PolicyConfig(tiny_model_dir), sampling=sampling, rollout=CustomEngine())


def test_the_vllm_engine_moves_into_a_process_of_its_own_not_started_before_setup(tiny_model_dir):
    from lit_entropy.module import RFTModule
    from lit_entropy.rollout import VLLMRolloutEngine
    from lit_entropy.rollout.process import ProcessRolloutEngine
    from lit_entropy.settings import PolicyConfig, TrainingSamplingConfig

    engine = VLLMRolloutEngine(max_model_len=64)
    sampling = TrainingSamplingConfig(async_rollout=AsyncRolloutConfig())
    module = RFTModule(PolicyConfig(tiny_model_dir), sampling=sampling, rollout=engine)
    assert isinstance(module.rollout_engine, ProcessRolloutEngine) and module.rollout_engine.engine is engine
    assert module.rollout_engine.pid is None and not engine.started
    assert module.rollout_engine.reports_logprobs  # the correction of stale samples needs the engine's log-probs


def test_dynamic_sampling_with_async_rollouts_is_refused_before_training(tiny_model_dir):
    from lit_entropy.module import RFTModule
    from lit_entropy.settings import PolicyConfig, TrainingSamplingConfig

    with pytest.raises(ValueError, match="model.sampling.async_rollout with model.sampling.filter_groups=true"):
        RFTModule(PolicyConfig(tiny_model_dir), sampling=TrainingSamplingConfig(filter_groups=True, async_rollout={}))


def test_close_drops_the_batches_not_started():
    started = threading.Event()
    release = threading.Event()
    generated = []

    def generate(batch):
        started.set()
        release.wait(5.0)
        generated.append(batch)
        return batch

    worker = RolloutWorker(generate, lambda w, v: None)
    for ticket in range(3):
        worker.submit(ticket, ticket)
    assert started.wait(5.0)
    worker.close(timeout_s=0.0)
    release.set()
    worker.thread.join(5.0)
    assert generated == [0] and not worker.thread.is_alive()


def test_a_lora_push_sends_the_adapters_and_buffers_not_the_frozen_base(tiny_model_dir):
    pytest.importorskip("peft", reason="needs the lora extra (pip install 'lit-entropy[lora]')")
    import copy

    from transformers import AutoModelForCausalLM

    from lit_entropy.async_rollout.pipeline import trained_weights
    from lit_entropy.models.lora import apply_lora

    policy = apply_lora(AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32), 4, 8.0, 0.0, None)
    worker_copy = copy.deepcopy(policy)
    with torch.no_grad():  # an update: only the adapters train
        for name, param in policy.named_parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param))
    pushed = trained_weights(policy)
    adapters = {name for name, param in policy.named_parameters() if param.requires_grad}
    assert adapters and all("lora_" in name for name in adapters)
    state = policy.state_dict()
    assert set(pushed) == adapters | {name for name, _ in policy.named_buffers() if name in state}
    assert sum(t.numel() for t in pushed.values()) < sum(t.numel() for t in state.values()) / 4
    worker_copy.load_state_dict(pushed, strict=False)
    for name, tensor in worker_copy.state_dict().items():  # the worker's copy is the updated policy again
        assert torch.equal(tensor, state[name]), name

    full = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert set(trained_weights(full)) == set(full.state_dict())  # full fine-tuning: everything is pushed

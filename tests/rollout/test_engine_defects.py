"""Engine defects of issue 23.3: greedy evaluation, the allocator cache before every wake, the push after a resume,
one outcome of a weight push on every rank, and CUDA graphs by default on CUDA."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo
from torch import nn

from lit_entropy.rollout import HFRolloutEngine, SamplingConfig, VLLMRolloutEngine
from lit_entropy.rollout.vllm import default_enforce_eager
from lit_entropy.settings import EvaluationConfig

EOS, PAD = 1, 0


class _FakeLLM:
    """Records the calls the engine makes; generates ``[7, EOS]``; its push fails when asked to."""

    def __init__(self, calls: list[str], fail_push: bool = False):
        self.calls, self.fail_push = calls, fail_push

    def sleep(self, level):
        self.calls.append("sleep")

    def wake_up(self, tags):
        self.calls.append("wake_" + "+".join(tags))

    def collective_rpc(self, method, kwargs):
        if self.fail_push:
            raise KeyError("no such parameter")
        self.calls.append(f"push:{len(list(kwargs['weights_iterator']))}")

    def reset_prefix_cache(self):
        pass

    def generate(self, prompts, params, use_tqdm):
        self.calls.append("generate")
        step = [{7: SimpleNamespace(logprob=-0.5)}, {EOS: SimpleNamespace(logprob=-0.25)}]
        samples = [SimpleNamespace(index=i, token_ids=[7, EOS], logprobs=step) for i in range(params.n)]
        return [SimpleNamespace(outputs=samples) for _ in prompts]


def _engine(llm: _FakeLLM, **kwargs) -> VLLMRolloutEngine:
    engine = VLLMRolloutEngine("unused", eos_token_id=EOS, pad_token_id=PAD, **kwargs)
    engine._llm, engine._sampling_params_cls = llm, SimpleNamespace
    return engine


def test_greedy_evaluation_on_the_hf_engine_is_the_argmax_path(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    greedy = EvaluationConfig(num_samples=1, temperature=0, top_p=0.5)
    sampling = greedy.sampling_config(SamplingConfig(max_new_tokens=6))
    prompt = torch.tensor([[5, 6, 7, 8]])
    engine = HFRolloutEngine(eos_token_id=EOS, pad_token_id=PAD)
    batch = engine.generate(model, prompt, torch.ones_like(prompt), sampling)
    ids = prompt.clone()
    with torch.no_grad():
        for _ in range(6):  # the argmax of one full forward per step, stopping at EOS
            ids = torch.cat([ids, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
            if ids[0, -1] == EOS:
                break
    length = int(batch.response_mask.sum())
    assert batch.responses[0, :length].tolist() == ids[0, 4:].tolist()
    assert batch.rollout_logprobs is None


def test_vllm_gets_greedy_evaluation_as_temperature_zero():
    llm = _FakeLLM([])
    sampling = EvaluationConfig(num_samples=1, temperature=0).sampling_config(SamplingConfig())
    params = _engine(llm)._sampling_params(sampling)
    assert params.temperature == 0 and params.n == 1


def test_the_allocator_cache_is_emptied_before_every_wake(monkeypatch):
    calls: list[str] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: calls.append("empty_cache"))
    engine = _engine(_FakeLLM(calls), enable_sleep=True)
    engine._sleep()
    policy = nn.Linear(2, 2)
    engine.generate(policy, torch.tensor([[2, 3]]), torch.ones(1, 2), SamplingConfig(2, max_new_tokens=2))
    engine.generate(policy, torch.tensor([[2, 3]]), torch.ones(1, 2), SamplingConfig(2, max_new_tokens=2))
    wakes = [i for i, call in enumerate(calls) if call.startswith("wake_")]
    assert len(wakes) == 4 and all(calls[i - 1] == "empty_cache" for i in wakes), calls


def test_a_resumed_run_pushes_before_its_first_rollout_without_initial_sync():
    """The module syncs at the current step before generating: a no-op at step 0 with ``initial_sync=False`` (the
    disk holds step 0), a push at a resumed step, then no push again until the step changes."""
    calls: list[str] = []
    engine, policy = _engine(_FakeLLM(calls), initial_sync=False), nn.Linear(2, 2)
    engine.sync_weights(policy, 0)
    assert calls == []
    engine.sync_weights(policy, 5)  # the first training_step after resuming at step 5
    engine.generate(policy, torch.tensor([[2, 3]]), torch.ones(1, 2), SamplingConfig(2, max_new_tokens=2))
    engine.sync_weights(policy, 5)
    assert calls == ["push:2", "generate"]


def test_the_module_syncs_at_the_current_step_before_generating():
    """The synchronous step (``model.sampling.async_rollout: null``, what ``training_step`` takes its batch from)
    pushes the policy at the module's current step, then generates with that engine: a resumed run never samples stale
    weights."""
    from types import SimpleNamespace

    from lit_entropy.async_rollout.pipeline import SynchronousRollouts

    calls: list[str] = []
    engine, policy = _engine(_FakeLLM(calls), initial_sync=False), nn.Linear(2, 2)
    batch = {"input_ids": torch.tensor([[2, 3]]), "attention_mask": torch.ones(1, 2)}
    sampling = SamplingConfig(2, max_new_tokens=2)

    def generate(batch, sampling):
        return engine.generate(policy, batch["input_ids"], batch["attention_mask"], sampling)

    host = SimpleNamespace(
        rollout_engine=engine,
        policy=policy,
        global_step=5,
        generate=generate,
        settings=SimpleNamespace(sampling=sampling),
    )
    taken_batch, _ = SynchronousRollouts().take(host, batch)
    assert taken_batch is batch and calls == ["push:2", "generate"]


def _push_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    init_gloo(rank, world_size, port)
    try:
        engine = _engine(_FakeLLM([], fail_push=rank == 0))
        try:
            engine.sync_weights(nn.Linear(2, 2), step=1)
            outcome = "returned"
        except RuntimeError as err:
            outcome = str(err)
        dist.barrier()  # both ranks get here: neither waits in a collective the other left
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(outcome, fh)
    finally:
        dist.destroy_process_group()


@pytest.mark.ddp
def test_a_push_that_fails_on_one_rank_raises_on_every_rank(tmp_path):
    mp.spawn(_push_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    for rank in range(2):
        outcome = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert outcome == "the vLLM rollout engine failed to load the policy's weights on rank(s) [0]", rank


@pytest.mark.parametrize(
    ("device", "given", "eager"),
    [("cuda", None, False), ("cpu", None, True), ("cuda", True, True), ("cpu", False, False)],
)
def test_cuda_graphs_by_default_on_cuda_eager_elsewhere(device, given, eager):
    assert default_enforce_eager(device, given) is eager
    assert VLLMRolloutEngine().enforce_eager is None

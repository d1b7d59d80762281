"""Multi-turn rollouts on the real vLLM engine (``vllm`` marker; .ci/run runs them in its vLLM venv): the turns of
all live trajectories go to vLLM in one call per round, and the trainer's ids and log-probs are the engine's."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.agents import MultiTurnConfig, MultiTurnRollout
from lit_entropy.rollout import SamplingConfig
from lit_entropy.rollout.vllm import VLLMRolloutEngine
from tests.agents._agents import chat_tokenizer
from tests.agents.test_agents_exactness import _unpadded_logprobs
from tests.agents.test_agents_template import EOS, _batch

# float32 vLLM (CPU) against float32 HF, as tests/rollout/test_vllm_rollout.py measures it.
TOL = 1e-4


class _Counting(VLLMRolloutEngine):
    """The vLLM engine, recording the rows of each generate call and the ids it sampled for each."""

    calls: list[int]
    sampled: list[list[list[int]]]

    def generate(self, policy, input_ids, attention_mask, sampling):
        self.calls.append(input_ids.shape[0])
        out = super().generate(policy, input_ids, attention_mask, sampling)
        self.sampled.append([row[m].tolist() for row, m in zip(out.responses, out.response_mask, strict=True)])
        return out


@pytest.fixture(scope="module")
def vllm_chat(tmp_path_factory):
    pytest.importorskip("vllm")
    from transformers import AutoModelForCausalLM  # noqa: PLC0415 - reason: only with vLLM installed

    from lit_entropy.models.tiny import save_tiny_model  # noqa: PLC0415 - reason: as above

    torch.set_num_threads(1)
    # head_dim 64: vLLM's CPU attention does not serve 16.
    path = str(save_tiny_model(tmp_path_factory.mktemp("vllm_chat"), chat_tokenizer(), hidden_size=128, num_layers=2))
    engine = _Counting(
        path, eos_token_id=[EOS], pad_token_id=0, dtype="float32", max_model_len=256, seed=0,
        extra_engine_kwargs={"kv_cache_memory_bytes": 16 << 20},
    )  # fmt: skip
    engine.calls, engine.sampled = [], []
    engine.start()
    yield engine, AutoModelForCausalLM.from_pretrained(path).float()
    engine.close()


@pytest.mark.vllm
def test_vllm_batches_the_turns_and_the_trainer_sees_its_ids_and_logprobs(vllm_chat):
    engine, model = vllm_chat
    tokenizer = chat_tokenizer()
    rollout = MultiTurnRollout(MultiTurnConfig(environment="tests.agents._agents:Guess", max_turns=4))
    rollout.bind(tokenizer, [EOS])
    batch = _batch(tokenizer, ["1+2=", "7*8=", "9-4="], ["3", "56", "5"])
    engine.calls.clear()
    engine.sampled.clear()
    out = rollout.generate(engine, model, batch, SamplingConfig(num_samples=2, max_new_tokens=80))
    turns = out.trajectories.turns
    assert out.environment_mask.any() and (turns > 1).any()
    # One engine call per round, holding every trajectory still live in it.
    assert engine.calls == [int((turns > k).sum()) for k in range(int(turns.max()))]
    # Independent reference: the conversation rebuilt from the engine's own samples (special tokens kept, the closing
    # EOS left to the template) and the environment's messages, rendered whole and tokenized at once.
    for row in range(out.sequences.shape[0]):
        count = int(turns[row])
        live = [[r for r, n in enumerate(turns.tolist()) if n > call].index(row) for call in range(count)]
        replies = [engine.sampled[call][k] for call, k in enumerate(live)]
        environment = iter(m for m in out.trajectories.conversations[row] if m["role"] != "assistant")
        messages = [{"role": "user", "content": ["1+2=", "7*8=", "9-4="][row // 2]}]
        for turn, ids in enumerate(replies):
            ended = bool(ids) and ids[-1] == EOS
            messages.append({"role": "assistant", "content": tokenizer.decode(ids[:-1] if ended else ids)})
            if turn < count - 1:
                messages.append(next(environment))
        reference = tokenizer(tokenizer.apply_chat_template(messages, tokenize=False))["input_ids"]
        ids = out.sequences[row][out.attention_mask[row].bool()].tolist()
        if out.trajectories.stop_reasons[row] == 2:  # length: the last turn was cut at the budget
            reference = reference[: len(ids)]
        assert reference[: len(ids)] == ids
    mask = out.response_mask
    reference = _unpadded_logprobs(model, out)
    assert (out.rollout_logprobs[mask].double() - reference[mask]).abs().max() < TOL
    assert (out.rollout_logprobs[out.environment_mask] == 0).all()

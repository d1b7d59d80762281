"""Exactness of multi-turn rows under the real HF engine and the real loss: the trainer scores exactly the sampled
ids with the log-probs they were sampled with, and environment tokens get no gradient and no log-prob."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from lit_entropy.agents import MultiTurnConfig, MultiTurnRollout
from lit_entropy.models.tiny import save_tiny_model
from lit_entropy.rollout import HFRolloutEngine, SamplingConfig
from lit_entropy.settings import LossConfig, PolicyConfig, RFTSettings
from lit_entropy.step import build_experience, response_forward, rows_update_loss
from lit_entropy.step.experience import RolloutStatistics
from tests.agents._agents import chat_tokenizer
from tests.agents.test_agents_template import EOS, _batch


class _Spy(HFRolloutEngine):
    """The HF engine, recording the ids it sampled per call and row."""

    def __init__(self) -> None:
        super().__init__(eos_token_id=EOS, pad_token_id=0)
        self.sampled: list[list[list[int]]] = []

    def generate(self, policy, input_ids, attention_mask, sampling):
        out = super().generate(policy, input_ids, attention_mask, sampling)
        self.sampled.append([row[m].tolist() for row, m in zip(out.responses, out.response_mask, strict=True)])
        return out


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("chat"), chat_tokenizer(), seed=3)
    return str(path), AutoModelForCausalLM.from_pretrained(path).float()


def _rollout(model, budget=60, seed=0):
    """A text-environment rollout of the real (random) tiny model: several turns, environment tokens between."""
    tokenizer = chat_tokenizer()
    rollout = MultiTurnRollout(MultiTurnConfig(environment="tests.agents._agents:Guess", max_turns=4))
    rollout.bind(tokenizer, [EOS])
    engine = _Spy()
    torch.manual_seed(seed)
    batch = _batch(tokenizer, ["1+2=", "7*8=", "9-4="], ["3", "56", "5"])
    out = rollout.generate(engine, model, batch, SamplingConfig(num_samples=2, max_new_tokens=budget))
    return out, engine


def _unpadded_logprobs(model, out):
    """Independent reference: each row's real tokens alone (no padding), a plain forward, log-softmax, gather."""
    result = torch.zeros(out.response_mask.shape, dtype=torch.float64)
    prompt = out.prompt_length
    for row in range(out.sequences.shape[0]):
        keep = out.attention_mask[row].bool()
        ids = out.sequences[row][keep]
        start = int(keep[:prompt].sum())
        with torch.no_grad():
            logits = model(input_ids=ids.unsqueeze(0)).logits[0].double()
        logp = torch.log_softmax(logits[:-1], -1).gather(-1, ids[1:].unsqueeze(-1)).squeeze(-1)
        result[row, : len(ids) - start] = logp[start - 1 :]
    return result


def test_trainer_scores_exactly_the_sampled_ids_with_their_sampling_logprobs(chat_model):
    _, model = chat_model
    out, engine = _rollout(model)
    assert out.environment_mask.any(), "the rollout must hold environment tokens between turns"
    assert (out.trajectories.turns > 1).any()
    # The ids under the response mask are the engine's samples, turn after turn (a row takes part in as many engine
    # calls as it has turns, from the first; only its last turn may be cut at the budget).
    turns = out.trajectories.turns.tolist()
    for row, count in enumerate(turns):
        live_before = [[r for r, n in enumerate(turns) if n > call].index(row) for call in range(count)]
        sampled = [i for call, k in enumerate(live_before) for i in engine.sampled[call][k]]
        policy_ids = out.responses[row][out.response_mask[row]].tolist()
        assert sampled[: len(policy_ids)] == policy_ids and len(sampled) >= len(policy_ids)
    # Trainer log-probs (padded batch, the statistics pass's forward) = the engine's = an unpadded re-derivation.
    reference = _unpadded_logprobs(model, out)
    mask = out.response_mask
    for blockwise in (True, False):
        stats = response_forward(model, out, temperature=1.0, blockwise=blockwise).stats
        assert torch.allclose(stats.logprobs[mask].double(), reference[mask], atol=1e-5)
    assert torch.allclose(out.rollout_logprobs[mask].double(), reference[mask], atol=1e-5)
    assert (out.rollout_logprobs[out.environment_mask] == 0).all()  # no rollout log-prob on environment tokens


def test_environment_tokens_get_exactly_zero_gradient_in_every_loss_term(chat_model):
    path, model = chat_model
    out, _ = _rollout(model)
    settings = RFTSettings.build(
        policy=PolicyConfig(path, blockwise_lm_head=False),
        sampling=SamplingConfig(num_samples=2, max_new_tokens=60),
        loss=LossConfig(kl_coef=0.1, entropy_coef=0.01),
    )
    with torch.no_grad():
        forward = response_forward(model, out, temperature=1.0, policy_average=True)
    # Reference log-probs for the KL term: shifted, so the KL has a gradient everywhere it is counted.
    stats = RolloutStatistics.from_passes(forward.stats, ref_logprobs=forward.stats.logprobs - 0.3)
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.0, 1.0, 0.2])
    experience = build_experience(out, rewards, stats, settings)
    experience.old_logprobs = experience.old_logprobs - 0.05  # a ratio away from 1 on every policy token
    captured = {}

    def keep_grad(module, args, output):
        output.retain_grad()
        captured["logits"] = output

    handle = model.get_output_embeddings().register_forward_hook(keep_grad)
    try:
        loss = rows_update_loss(model, experience, settings, normalizer=float(experience.loss_mask.sum())).loss
        loss.backward()
    finally:
        handle.remove()
        model.zero_grad(set_to_none=True)
    grad = captured["logits"].grad  # [N, T, V]: column t predicts response token t
    env = out.environment_mask
    assert grad.shape[:2] == env.shape
    assert (grad[env] == 0).all()  # exactly zero, not small
    assert (grad[out.response_mask].abs().sum(-1) > 0).all()  # every policy token does get a gradient

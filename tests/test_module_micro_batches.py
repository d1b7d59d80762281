"""RFTModule under a token budget (``model.update.max_tokens_per_micro_batch``), padded or packed: the single update
reuses the statistics pass's forwards (one per micro-batch) and its gradient equals a per-row float64 reference
computed from scratch (unpadded rows, full logits, the clipped surrogate at ratio 1, the entropy bonus)."""

from __future__ import annotations

import pytest
import torch
from _micro_batch_data import mixed_rollout

from lit_entropy.module import RFTModule
from lit_entropy.settings import LossConfig, PolicyConfig, TrainingSamplingConfig, UpdateConfig
from lit_entropy.step import build_experience

PROMPTS = [3, 7, 5, 2, 6, 4, 7, 3]
RESPONSES = [2, 11, 6, 1, 9, 4, 3, 12]
BUDGET = 40
TEMPERATURE = 0.7
ENTROPY_COEF = 0.05


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from lit_entropy.data.char_tokenizer import build_char_tokenizer
    from lit_entropy.models.tiny import save_tiny_model

    return str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", build_char_tokenizer(), num_layers=2))


def _module(model_dir: str, mode: str, update: UpdateConfig, blockwise: bool) -> RFTModule:
    module = RFTModule(
        PolicyConfig(model_dir, blockwise_lm_head=blockwise),
        sampling=TrainingSamplingConfig(num_samples=4, temperature=TEMPERATURE),
        loss=LossConfig(loss_agg_mode=mode, entropy_coef=ENTROPY_COEF),
        update=update,
    )
    module.configure_model()
    module.policy.double()
    return module


def _reference_gradients(model, rollout, advantages: torch.Tensor, mode: str) -> dict[str, torch.Tensor]:
    """The gradient of the update loss, one unpadded row at a time: log-probs and entropy from the full softmax of
    ``logits / T``; at ratio 1 the clipped surrogate's gradient is ``-A * grad log p`` (no clip binds)."""
    model.zero_grad(set_to_none=True)
    mask = rollout.response_mask
    p_max = rollout.prompt_length
    terms = []
    for row in range(mask.shape[0]):
        prompt = int(rollout.attention_mask[row, :p_max].sum())
        length = int(mask[row].sum())
        ids = rollout.sequences[row, p_max - prompt : p_max + length].unsqueeze(0)
        logits = model(input_ids=ids).logits[0, prompt - 1 : prompt - 1 + length].double() / TEMPERATURE
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, ids[0, prompt:, None]).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        ratio = torch.exp(logp - logp.detach())
        terms.append((-advantages[row, :length] * ratio, entropy))
    if mode == "token-mean":
        tokens = sum(pg.numel() for pg, _ in terms)
        pg_loss = sum(pg.sum() for pg, _ in terms) / tokens
        bonus = sum(ent.sum() for _, ent in terms) / tokens
    else:  # seq-mean-token-mean
        pg_loss = sum(pg.mean() for pg, _ in terms) / len(terms)
        bonus = sum(ent.mean() for _, ent in terms) / len(terms)
    (pg_loss - ENTROPY_COEF * bonus).backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize(
    ("budget", "packed", "blockwise"),
    [(None, False, True), (BUDGET, False, True), (BUDGET, False, False), (BUDGET, True, True), (BUDGET, True, False)],
)
def test_the_single_update_reuses_every_micro_batchs_forward_and_matches_a_per_row_reference(
    model_dir, mode, budget, packed, blockwise
):
    module = _module(model_dir, mode, UpdateConfig(max_tokens_per_micro_batch=budget, pack_sequences=packed), blockwise)
    policy = module.policy
    rollout = mixed_rollout(policy.config.vocab_size, PROMPTS, RESPONSES, width=14)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    experience = build_experience(rollout, rewards, module.statistics_pass(rollout), module.settings)
    reused = experience.update_forward
    assert reused is not None
    if budget is None:
        assert len(reused) == 1 and reused[0][0] == slice(None)
    else:  # one forward per token-budget micro-batch, each on its rows only
        assert len(reused) > 2 and sorted(torch.cat([rows for rows, _ in reused]).tolist()) == list(range(8))

    calls = []
    hook = policy.register_forward_pre_hook(lambda *_: calls.append(1))
    policy.zero_grad(set_to_none=True)
    index = torch.arange(len(PROMPTS))
    normalizer = module.loss_normalizer(experience.loss_mask)
    try:
        for _, micro, forward in experience.update_parts(index, module.settings.update):
            module.minibatch_loss(micro, normalizer, forward).loss.backward()
    finally:
        hook.remove()
    assert not calls, "the update must run no forward of its own"
    got = {name: p.grad.clone() for name, p in policy.named_parameters() if p.grad is not None}

    want = _reference_gradients(policy, rollout, experience.advantages.double(), mode)
    assert got.keys() == want.keys()
    for name, grad in want.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_reuse_off_or_several_updates_keep_a_separate_update_forward(model_dir):
    for update in (
        UpdateConfig(max_tokens_per_micro_batch=BUDGET, reuse_statistics_forward=False),
        UpdateConfig(max_tokens_per_micro_batch=BUDGET, epochs=2),
        UpdateConfig(max_tokens_per_micro_batch=BUDGET, micro_batch_size=4),
    ):
        module = _module(model_dir, "token-mean", update, blockwise=True)
        rollout = mixed_rollout(module.policy.config.vocab_size, PROMPTS, RESPONSES, width=14)
        assert module.statistics_pass(rollout).update_forward is None

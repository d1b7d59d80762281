"""Token-budget micro-batches (``model.update.max_tokens_per_micro_batch``): the grouping, and that splitting the
rows into trimmed micro-batches changes neither the statistics nor any parameter gradient of the update (float64)."""

from __future__ import annotations

import pytest
import torch
from _micro_batch_data import mixed_rollout, random_experience

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.functional.losses import LOSS_AGG_MODES
from lit_entropy.models.tiny import build_qwen2
from lit_entropy.settings import LossConfig, PolicyConfig, PPOConfig, RFTSettings, UpdateConfig
from lit_entropy.step import (
    UpdateTerms,
    global_loss_normalizer,
    response_forward,
    rows_update_loss,
    update_loss,
)
from lit_entropy.step.micro_batches import (
    group_rows,
    micro_batch_tokens,
    micro_batches,
    split_to_count,
    trim_rollout,
)

PROMPTS = [3, 7, 5, 2, 6, 4, 7, 3]
RESPONSES = [2, 11, 6, 1, 9, 4, 3, 12]
BUDGET = 40


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return build_qwen2(build_char_tokenizer(), num_layers=2, hidden_size=32).double()


def test_groups_fit_the_budget_cover_every_row_once_and_follow_length():
    prompt, response = torch.tensor(PROMPTS), torch.tensor(RESPONSES)
    groups = group_rows(prompt, response, BUDGET)
    rows = torch.cat(groups)
    assert sorted(rows.tolist()) == list(range(len(PROMPTS)))
    totals = (prompt + response)[rows]
    assert bool((totals[1:] >= totals[:-1]).all())  # sorted by length: short rows share a group
    for g in groups:
        tokens = g.numel() * int(prompt[g].max() + response[g].max())
        assert tokens == micro_batch_tokens(prompt[g], response[g], packed=False)
        assert tokens <= BUDGET or g.numel() == 1
    # greedy: no group could have taken the next group's first row
    for a, b in zip(groups, groups[1:], strict=False):
        both = torch.cat([a, b[:1]])
        assert both.numel() * int(prompt[both].max() + response[both].max()) > BUDGET
    assert len(groups) > 2
    assert [len(g) for g in group_rows(prompt, response, BUDGET, max_rows=2)] == [2, 2, 2, 2]
    # packed: the budget counts real tokens
    for g in group_rows(prompt, response, BUDGET, packed=True):
        assert int((prompt[g] + response[g]).sum()) <= BUDGET or g.numel() == 1


def test_a_row_over_the_budget_runs_alone_and_splitting_keeps_the_budget():
    prompt, response = torch.tensor([2, 2, 2, 9]), torch.tensor([1, 1, 1, 30])
    groups = group_rows(prompt, response, 12)
    assert [g.tolist() for g in groups] == [[0, 1, 2], [3]]
    split = split_to_count(groups, 5)
    assert len(split) == 5 and sorted(torch.cat(split).tolist()) == [0, 1, 2, 3]
    assert sum(g.numel() == 0 for g in split) == 1  # 4 rows make at most 4 non-empty groups
    assert split_to_count(groups, 2) == groups


def test_trim_drops_only_all_padding_columns():
    rollout = mixed_rollout(14, [2, 4], [3, 1], width=7)
    trimmed = trim_rollout(rollout.select(torch.tensor([0])))
    assert trimmed.sequences.shape == (1, 5) and trimmed.response_mask.shape == (1, 3)
    assert torch.equal(trimmed.sequences[0], rollout.sequences[0, 2:7])
    assert bool(trimmed.attention_mask.all())


def _gradients(model, settings, experience, micro):
    model.zero_grad(set_to_none=True)
    mask = experience.loss_mask
    normalizer = global_loss_normalizer(mask, settings.loss.loss_agg_mode)
    for index, trim in micro:
        rows = experience.micro_batch(index, trim=trim)
        rows_update_loss(model, rows, settings, normalizer=normalizer).loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("blockwise", [True, False])
def test_every_loss_agg_mode_gives_the_one_micro_batch_gradient(model, mode, blockwise):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES)
    experience = random_experience(model, rollout)
    settings = RFTSettings.build(
        policy=PolicyConfig(blockwise_lm_head=blockwise),
        loss=LossConfig(loss_agg_mode=mode, kl_coef=0.1, entropy_coef=0.05, clip_ratio_c=None),
    )
    everything = torch.arange(len(PROMPTS))
    want = _gradients(model, settings, experience, [(everything, False)])
    plan = micro_batches(rollout, UpdateConfig(max_tokens_per_micro_batch=BUDGET), everything)
    assert len(plan) > 2 and max(trim_rollout(rollout.select(p)).sequences.shape[1] for p in plan) > 0
    assert min(trim_rollout(rollout.select(p)).sequences.shape[1] for p in plan) < rollout.sequences.shape[1]
    got = _gradients(model, settings, experience, [(p, True) for p in plan])
    assert got.keys() == want.keys() and len(want) == len(list(model.parameters()))
    for name, grad in want.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12, msg=name)


def test_an_empty_micro_batch_adds_nothing(model):
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES)
    experience = random_experience(model, rollout)
    settings = RFTSettings.build()
    everything = torch.arange(len(PROMPTS))
    want = _gradients(model, settings, experience, [(everything, True)])
    got = _gradients(model, settings, experience, [(everything, True), (torch.empty(0, dtype=torch.long), True)])
    for name, grad in want.items():
        torch.testing.assert_close(got[name], grad, rtol=0, atol=0, msg=name)


@pytest.mark.parametrize("blockwise", [True, False])
def test_the_statistics_pass_under_a_budget_equals_the_padded_pass(tmp_path, blockwise):
    from lit_entropy.models.tiny import save_tiny_model
    from lit_entropy.module import RFTModule

    path = str(save_tiny_model(tmp_path / "m", build_char_tokenizer(), num_layers=2))
    modules = []
    for budget in (None, BUDGET):
        module = RFTModule(
            PolicyConfig(path, blockwise_lm_head=blockwise),
            loss=LossConfig(kl_coef=0.1),
            update=UpdateConfig(max_tokens_per_micro_batch=budget, reuse_statistics_forward=False),
        )
        module.configure_model()
        module.policy.double(), module.ref_model.double()
        modules.append(module)
    rollout = mixed_rollout(modules[0].policy.config.vocab_size, PROMPTS, RESPONSES, width=14)
    want, got = (m.statistics_pass(rollout) for m in modules)
    mask = rollout.response_mask
    for name in ("old_logprobs", "entropy", "discriminator", "ref_logprobs"):
        a, b = getattr(want, name), getattr(got, name)
        assert b.shape == a.shape
        torch.testing.assert_close(b[mask], a[mask], rtol=1e-9, atol=1e-12, msg=name)


def test_token_means_over_budget_micro_batches_are_those_of_every_loss_token(model):
    """``approx_kl`` and ``value_clip_frac`` of an update split into token-budget micro-batches of different token
    counts equal one big micro-batch's and a by-hand mean over every loss token; the share terms add up."""
    rollout = mixed_rollout(model.config.vocab_size, PROMPTS, RESPONSES)
    experience = random_experience(model, rollout)  # old log-probs = the model's + noise: approx_kl > 0
    gen = torch.Generator().manual_seed(5)
    mask, loss_mask = rollout.response_mask, experience.loss_mask
    values = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    old_values = values + 0.3 * torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    returns = torch.randn(mask.shape, generator=gen, dtype=torch.float64)
    experience = experience.with_row_tensors({"old_values": old_values, "returns": returns})
    settings = RFTSettings.build(
        algorithm="ppo", ppo=PPOConfig(clip_range_value=0.2), loss=LossConfig(kl_coef=0.1, clip_ratio_c=None)
    )
    normalizer = global_loss_normalizer(loss_mask, settings.loss.loss_agg_mode)

    def update_terms(plan, trim):
        terms, per_micro = UpdateTerms(), []
        for index in plan:
            rows = experience.micro_batch(index, trim=trim)
            with torch.no_grad():
                forward = response_forward(model, rows.rollout, temperature=1.0)
            width = rows.loss_mask.shape[1]
            out = update_loss(forward, rows, settings, normalizer=normalizer, values=values[index][:, :width])
            terms.add(out)
            per_micro.append({key: float(value) for key, value in out.terms.items()})
        return terms.means(1), per_micro

    everything = torch.arange(len(PROMPTS))
    want, _ = update_terms([everything], trim=False)
    plan = micro_batches(rollout, UpdateConfig(max_tokens_per_micro_batch=BUDGET), everything)
    got, per_micro = update_terms(plan, trim=True)
    counts = [int(loss_mask[p].sum()) for p in plan]
    assert len(plan) > 2 and len(set(counts)) > 1  # micro-batches of different loss-token counts
    assert got.keys() == want.keys() >= {"approx_kl", "value_clip_frac", "pg_loss", "kl", "value_loss"}
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key

    # by hand, over every loss token: k3 of the ratio, and where the clipped value's squared error is the larger
    with torch.no_grad():
        logprobs = response_forward(model, rollout, temperature=1.0).stats.logprobs
    log_ratio = (logprobs - experience.old_logprobs)[loss_mask]
    k3 = (log_ratio.exp() - 1 - log_ratio).mean()
    clipped = torch.minimum(torch.maximum(values, old_values - 0.2), old_values + 0.2)
    binds = ((clipped - returns).square() > (values - returns).square())[loss_mask].double().mean()
    assert got["approx_kl"] == pytest.approx(float(k3), rel=1e-9) and 0 < binds < 1
    assert got["value_clip_frac"] == pytest.approx(float(binds), rel=1e-9)
    # the unweighted mean of the micro-batches' means (the old aggregation) is off
    for key in ("approx_kl", "value_clip_frac"):
        naive = sum(m[key] for m in per_micro) / len(per_micro)
        assert abs(naive - want[key]) > 1e-4, key

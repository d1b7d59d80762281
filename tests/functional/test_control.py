"""The entropy-control methods of issue 38 against float64 transcriptions of their authors' code (or the paper).

Each reference below is the authors' function restated line by line in float64, attributed with repository, path
and commit; it is independent of ``lit_entropy.functional.control`` (no shared helper). Cases: random batches with
right-padded and holed masks, a row without a valid token, advantages of both signs and zero (per sequence, as
GRPO's), and tied scores (log-probs rounded to a few values) where the method ranks.
"""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest
import torch

from lit_entropy.functional.control import (
    StareState,
    entrocraft_advantages,
    entrocraft_bounds,
    entrocraft_phase,
    interpolated_quantile,
    repo_r_advantages,
    repo_r_zeta,
    reweighted_advantages,
    s2t_mask,
    stare_controller_step,
    stare_selection_count,
    stare_weights,
    unlikeliness_advantages,
)
from lit_entropy.functional.selection import top_k_cut

F64 = torch.float64
SEEDS = range(12)
STARE_COMMIT = "hp-luo/STARE@bffb9e79c96c318340e35402993d60548d864315"
ENTROCRAFT_COMMIT = "lblaoke/entrocraft@26165bde0cde7757bf1ce54bee0d101ab700c80f"
AR_LOPTI_COMMIT = "zhyang2226/AR-Lopti@cbeb333376decdfe571fa8613bdebcfcc526628d"
UNLIKELY_COMMIT = "AndreHe02/rewarding-unlikely-release@ca1cff05ebdf2cfe9737fd416897da838a93e11a"


def _case(seed: int, *, rows: int = 8, width: int = 7, group: int = 4, ties: bool = False):
    """(logprobs, entropy, advantages, mask, rewards): a row without tokens, holes, both advantage signs."""
    gen = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(rows, width, generator=gen, dtype=F64) * 6
    if ties:
        logprobs = torch.round(logprobs)  # a handful of values: ties everywhere, also at the cuts
    entropy = torch.rand(rows, width, generator=gen, dtype=F64) * 2
    lengths = torch.randint(1, width + 1, (rows,), generator=gen)
    mask = torch.arange(width) < lengths.unsqueeze(-1)
    mask &= torch.rand(rows, width, generator=gen) > 0.15  # holes
    mask[seed % rows] = False  # a row without a valid token
    rewards = torch.randint(0, 2, (rows,), generator=gen).to(F64)
    if seed % 3 == 0:
        rewards = 2 * rewards - 1  # signed rewards (+1 / -1)
    grouped = rewards.reshape(-1, group)
    std = grouped.std(-1, keepdim=True)
    adv = ((grouped - grouped.mean(-1, keepdim=True)) / (std + 1e-6)).reshape(-1)
    advantages = adv.unsqueeze(-1).expand(rows, width).masked_fill(~mask, 0.0).contiguous()
    return logprobs, entropy, advantages, mask, rewards


# --------------------------------------------------------------------------------------------------- STARE
def _ref_stare_weights(log_prob, advantages, response_mask, top_ratio, w, m, variant, gate_on):
    """``compute_stare_token_weights`` of STARE_COMMIT, ``verl/trainer/ppo/core_algos.py``, in float64."""
    weights = torch.ones_like(advantages)
    valid = response_mask > 0
    positive_candidates = valid & (advantages > 0)
    negative_candidates = valid & (advantages < 0)
    surprisal = -log_prob.detach()

    def top_surprisal_mask(candidate_mask):
        candidate_count = int(candidate_mask.sum().item())
        selected = torch.zeros_like(candidate_mask, dtype=torch.bool)
        if candidate_count == 0 or top_ratio <= 0.0:
            return selected
        k = max(1, int(candidate_count * top_ratio + 0.999999))
        k = min(k, candidate_count)
        candidate_values = surprisal[candidate_mask]
        _, topk_local_idx = torch.topk(candidate_values, k=k, largest=True)
        flat_candidate_idx = candidate_mask.reshape(-1).nonzero(as_tuple=False).squeeze(-1)
        selected.reshape(-1)[flat_candidate_idx[topk_local_idx]] = True
        return selected

    l_plus = top_surprisal_mask(positive_candidates)
    l_minus = top_surprisal_mask(negative_candidates) if variant == "C2" else torch.zeros_like(valid)
    if gate_on:
        weights = torch.where(l_plus, torch.full_like(weights, w), weights)
        if variant == "C2":
            weights = torch.where(l_minus, torch.full_like(weights, m), weights)
    return weights


def _ref_stare_controller(state, current_ent, target, adaptive, alpha, w_max, m_min):
    """``STAREController.update`` of STARE_COMMIT (state as a dict of its attributes)."""
    if not np.isfinite(current_ent):
        return state
    state = dict(state, current_ent=float(current_ent), gate_on=bool(current_ent < target))
    if not adaptive or alpha == 0.0:
        return state
    sign = float(np.sign(target - current_ent))
    state["reweight_w"] = float(np.clip(state["reweight_w"] + alpha * sign, 1.0, w_max))
    state["reweight_m"] = float(np.clip(state["reweight_m"] - alpha * sign, m_min, 1.0))
    return state


@pytest.mark.parametrize("variant", ["O1", "C2"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_stare_weights_match_the_authors(seed, ties, variant):
    logprobs, _, advantages, mask, _ = _case(seed, ties=ties)
    for top_ratio in (0.0, 0.1, 0.35, 1.0):
        ours = stare_weights(logprobs, advantages, mask, top_ratio=top_ratio, variant=variant)
        ref = _ref_stare_weights(logprobs, advantages, mask, top_ratio, 1.1, 0.9, variant, True)
        assert ours.dtype == F64
        if not ties:
            assert torch.equal(ours, ref), top_ratio
            continue
        # torch.topk breaks ties in no stated order; ours by token index. The same number of tokens is picked
        # from each set, with the same surprisals, and they differ only among tokens tied at the cut.
        surprisal = -logprobs
        for weight in (1.1, 0.9):
            picked, picked_ref = ours == weight, ref == weight
            assert int(picked.sum()) == int(picked_ref.sum())
            assert torch.equal(surprisal[picked].sort().values, surprisal[picked_ref].sort().values)
            if bool(picked.any()):
                cut = surprisal[picked].min()
                assert bool((picked == picked_ref)[surprisal != cut].all())
    off = stare_weights(logprobs, advantages, mask, top_ratio=0.5, variant=variant, gate_on=False)
    assert torch.equal(off, torch.ones_like(advantages))


def test_stare_global_cut_equals_the_single_process_selection():
    logprobs, _, advantages, mask, _ = _case(3)
    positive = mask & (advantages > 0)
    cut = top_k_cut(-logprobs, positive, stare_selection_count(int(positive.sum()), 0.3))
    assert torch.equal(
        stare_weights(logprobs, advantages, mask, top_ratio=0.3, positive_cut=cut),
        stare_weights(logprobs, advantages, mask, top_ratio=0.3),
    )


@pytest.mark.parametrize("count", [0, 1, 7, 10, 20, 33, 1000])
@pytest.mark.parametrize("ratio", [0.0, 0.1, 0.15, 0.3, 0.7, 1.0])
def test_stare_selection_count_is_the_authors_rounding(count, ratio):
    ref = 0 if count == 0 or ratio <= 0 else min(max(1, int(count * ratio + 0.999999)), count)
    assert stare_selection_count(count, ratio) == ref


@pytest.mark.parametrize("adaptive", [False, True])
def test_stare_controller_matches_the_authors(adaptive):
    gen = np.random.default_rng(0)
    entropies = [*gen.uniform(0.0, 0.6, 40), 0.3, math.nan, math.inf]
    state = StareState(True, 1.1, 0.9)
    ref = {"gate_on": True, "reweight_w": 1.1, "reweight_m": 0.9}
    for entropy in entropies:
        state = stare_controller_step(state, entropy, target_entropy=0.3, adaptive=adaptive, alpha=0.07)
        ref = _ref_stare_controller(ref, entropy, 0.3, adaptive, 0.07, 1.5, 0.5)
        assert state == StareState(ref["gate_on"], ref["reweight_w"], ref["reweight_m"])
    assert adaptive == (state.reweight_w != 1.1)


def _ref_vanilla_pg_losses(log_prob, old_log_prob, advantages, clip_low, clip_high, clip_c):
    """The per-token loss of ``compute_policy_loss_vanilla`` / ``_stare`` of STARE_COMMIT (before aggregation)."""
    ratio = torch.exp(torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0))
    pg_losses1 = -advantages * ratio
    pg_losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clip_pg_losses1 = torch.maximum(pg_losses1, pg_losses2)
    clip_pg_losses2 = torch.min(-advantages * clip_c, clip_pg_losses1)
    return torch.where(advantages < 0, clip_pg_losses2, clip_pg_losses1)


@pytest.mark.parametrize("seed", SEEDS)
def test_weighting_the_advantages_is_the_authors_weighted_surrogate(seed):
    """``compute_policy_loss_stare`` multiplies each token's dual-clip surrogate by w > 0; ours multiplies A by w."""
    from lit_entropy.functional import POLICY_LOSSES

    logprobs, _, advantages, mask, _ = _case(seed)
    old = logprobs + 0.3 * torch.randn(logprobs.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
    weights = stare_weights(old, advantages, mask, top_ratio=0.3, variant="C2")
    ref = _ref_vanilla_pg_losses(logprobs, old, advantages, 0.2, 0.28, 3.0) * weights
    ref_loss = (ref * mask).sum() / mask.sum()
    ours, _ = POLICY_LOSSES["ppo"](
        logprobs, old, weights * advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0,
        loss_agg_mode="token-mean", normalizer=float(mask.sum()), loss_scale_factor=None, response_mask=mask,
    )  # fmt: skip
    torch.testing.assert_close(ours, ref_loss, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------- Entrocraft
def _ref_entrocraft(token_level_rewards, response_mask, step, total_steps, current_entropy, lo_range, up_range,
                    index, schedule):  # fmt: skip
    """``compute_grpo_range_{linear,cos}_outcome_advantage`` of ENTROCRAFT_COMMIT, ``verl/trainer/ppo/core_algos.py``
    (with ``compute_raftpp_outcome_advantage``, ``compute_nsr_outcome_advantage``,
    ``compute_grpo_outcome_advantage``), in float64."""
    if schedule == "linear":
        progress = step / total_steps
    else:
        progress = 0.5 * (1 - math.cos(math.pi * step / total_steps))
    lower = lo_range[0] + (lo_range[1] - lo_range[0]) * progress
    upper = up_range[0] + (up_range[1] - up_range[0]) * progress
    scores = token_level_rewards.sum(dim=-1)
    if current_entropy > upper:
        advantages = scores.clone()
        advantages[advantages < 0.0] = 0.0
        return advantages.unsqueeze(-1) * response_mask, (lower, upper)
    if current_entropy < lower:
        advantages = scores.clone()
        advantages[advantages > 0.0] = 0.0
        return advantages.unsqueeze(-1) * response_mask, (lower, upper)
    id2score, id2mean, id2std = defaultdict(list), {}, {}
    for i in range(scores.shape[0]):
        id2score[index[i]].append(scores[i])
    for idx, values in id2score.items():
        stacked = torch.stack(values)
        id2mean[idx] = torch.mean(stacked) if len(values) > 1 else torch.tensor(0.0, dtype=F64)
        id2std[idx] = torch.std(stacked) if len(values) > 1 else torch.tensor(1.0, dtype=F64)
    scores = scores.clone()
    for i in range(scores.shape[0]):
        scores[i] = (scores[i] - id2mean[index[i]]) / (id2std[index[i]] + 1e-6)
    return scores.unsqueeze(-1) * response_mask, (lower, upper)


@pytest.mark.parametrize("schedule", ["linear", "cos"])
@pytest.mark.parametrize("seed", SEEDS)
def test_entrocraft_matches_the_authors(seed, schedule):
    _, _, advantages, mask, rewards = _case(seed)
    token_rewards = torch.zeros_like(advantages)
    token_rewards[:, 0] = rewards  # the sum over tokens is the sequence's reward
    index = np.repeat(np.arange(2), 4)
    gen = np.random.default_rng(seed)
    for step in (1, 7, 50, 100):
        for entropy in (*gen.uniform(0.2, 0.9, 3), 0.6, 0.7, 0.4, 0.5):
            ref, (lower, upper) = _ref_entrocraft(
                token_rewards, mask, step, 100, entropy, (0.6, 0.4), (0.7, 0.5), index, schedule
            )
            ours_band = entrocraft_bounds(step, 100, schedule=schedule)
            assert ours_band == pytest.approx((lower, upper), rel=0, abs=1e-15)
            phase = entrocraft_phase(entropy, *ours_band)
            ours = entrocraft_advantages(advantages, rewards, mask, phase, signal="reward")
            torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


def test_entrocraft_advantage_signal_clamps_the_estimators_advantages():
    _, _, advantages, mask, rewards = _case(1)
    pos = entrocraft_advantages(advantages, rewards, mask, "positive", signal="advantage")
    neg = entrocraft_advantages(advantages, rewards, mask, "negative", signal="advantage")
    assert torch.equal(pos + neg, advantages) and bool((pos >= 0).all() and (neg <= 0).all())
    assert torch.equal(entrocraft_advantages(advantages, rewards, mask, "grpo"), advantages)


# ---------------------------------------------------------------------------------------------------- S2T
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_s2t_mask_is_the_papers_criterion(seed, ties):
    """STAPO (arXiv 2602.15620) S2T: mask A > 0 and p < tau_p and H < the batch's 80th percentile, by brute force."""
    logprobs, entropy, advantages, mask, _ = _case(seed, ties=ties)
    if ties:
        entropy = torch.round(entropy * 2) / 2
    logprobs = logprobs - 2.0  # some tokens below p = 0.002 (log p < -6.2)
    for tau_p, q in ((0.002, 0.8), (0.05, 0.5), (1.0, 1.0)):
        valid = sorted(float(h) for h, m in zip(entropy.flatten(), mask.flatten(), strict=True) if m)
        pos = q * (len(valid) - 1)
        lo = math.floor(pos)
        tau_h = valid[lo] + (pos - lo) * (valid[min(lo + 1, len(valid) - 1)] - valid[lo])
        expected = mask.clone()
        for i, j in zip(*torch.nonzero(mask, as_tuple=True), strict=True):
            if advantages[i, j] > 0 and math.exp(logprobs[i, j]) < tau_p and entropy[i, j] < tau_h:
                expected[i, j] = False
        ours = s2t_mask(logprobs, entropy, advantages, mask, prob_threshold=tau_p, entropy_quantile=q)
        assert torch.equal(ours, expected)
    assert torch.equal(s2t_mask(logprobs, entropy, advantages, torch.zeros_like(mask)), torch.zeros_like(mask))


@pytest.mark.parametrize("n", [1, 2, 5, 17])
@pytest.mark.parametrize("q", [0.0, 0.2, 0.8, 0.95, 1.0])
def test_interpolated_quantile_ranks_are_torch_quantiles(n, q):
    values = torch.randn(n, generator=torch.Generator().manual_seed(n), dtype=F64)
    k_low, k_high, frac = interpolated_quantile(n, q)
    ranked = values.sort(descending=True).values
    got = ranked[k_low - 1] + frac * (ranked[k_high - 1] - ranked[k_low - 1])
    torch.testing.assert_close(got, torch.quantile(values, q), rtol=1e-12, atol=1e-12)


# -------------------------------------------------------------------------------------- advantage reweighting
def _ref_reweight(advantage, log_prob, reweight_k, reweight_tau, neg_adv_weight):
    """``compute_reweight_advantage`` of AR_LOPTI_COMMIT, ``verl/trainer/ppo/ray_trainer.py``, method
    ``both_linear_normal`` (``scripts/train_kklogic_AR_4x80GB.sh``), in float64."""
    reweight_advantage = (reweight_k * torch.exp(log_prob) + reweight_tau) * advantage
    neg_advantage = torch.where(advantage > 0, 0.0, reweight_advantage)
    pos_advantage = torch.where(advantage > 0, reweight_advantage, 0.0)
    neg_advantage *= neg_adv_weight
    return pos_advantage + neg_advantage


@pytest.mark.parametrize("seed", SEEDS)
def test_advantage_reweighting_matches_the_authors(seed):
    logprobs, _, advantages, mask, _ = _case(seed)
    for alpha, neg in ((0.2, 1.0), (0.0, 1.0), (0.5, 0.8), (1.0, 0.0)):
        ours = reweighted_advantages(advantages, logprobs, mask, alpha=alpha, negative_weight=neg)
        ref = _ref_reweight(advantages, logprobs, alpha, 1 - alpha, neg) * mask
        torch.testing.assert_close(ours, ref, rtol=1e-14, atol=1e-15)


# ------------------------------------------------------------------------------------------ unlikeliness
def _ref_unlikeliness(rewards, old_log_probs, eos_mask, index, rank_penalty, epsilon=1e-6):
    """``RayLeanTrainer._compute_advantages`` of UNLIKELY_COMMIT, ``verl/trainer/ppo/ray_lean_trainer.py``, in
    float64; verl's ``masked_mean(x, mask, axis=-1) = (x * mask).sum(-1) / mask.sum(-1)`` (NaN for an empty
    row); its ``argsort`` taken stable so that ties have one answer (see the module docstring)."""
    scores = rewards.clone()
    old_log_probs = (old_log_probs * eos_mask).sum(-1) / eos_mask.sum(-1)
    modified_scores = scores.clone()
    id_to_indices = defaultdict(list)
    for i in range(scores.shape[0]):
        id_to_indices[index[i]].append(i)
    for _, indices in id_to_indices.items():
        group_indices = torch.tensor(indices)
        group_scores = scores[group_indices]
        group_ranks = torch.argsort(torch.argsort(old_log_probs[group_indices], stable=True), stable=True)
        group_ranks = group_ranks / len(group_indices)
        group_scores = group_scores * (1 - group_ranks * rank_penalty)
        modified_scores[group_indices] = group_scores
        if len(group_indices) == 1:
            group_mean, group_std = torch.tensor(0.0, dtype=F64), torch.tensor(1.0, dtype=F64)
        else:
            group_mean, group_std = torch.mean(group_scores), torch.std(group_scores)
        for i in indices:
            scores[i] = (modified_scores[i] - group_mean) / (group_std + epsilon)
    return scores.unsqueeze(-1).tile([1, eos_mask.shape[-1]]) * eos_mask


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_unlikeliness_advantages_match_the_authors(seed, ties):
    logprobs, _, _, mask, rewards = _case(seed, ties=ties)
    if ties:  # equal mean log-probs within a group
        logprobs[1] = logprobs[0]
        mask[1] = mask[0]
    for group in (1, 2, 4, 8):
        index = np.repeat(np.arange(8 // group), group)
        for beta in (0.25, 0.0, 1.0):
            ours = unlikeliness_advantages(rewards, logprobs, mask, group_size=group, beta=beta)
            ref = _ref_unlikeliness(rewards.clone(), logprobs, mask.to(F64), index, beta)
            torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------------------------- REPO-R
@pytest.mark.parametrize("seed", SEEDS)
def test_repo_r_is_the_stated_equation(seed):
    """REPO-R (arXiv 2603.11682): A' = A - zeta |A| (log p + H), token by token."""
    logprobs, entropy, advantages, mask, _ = _case(seed)
    for zeta in (0.0, 0.05, 1.0):
        ours = repo_r_advantages(advantages, logprobs, entropy, mask, zeta=zeta)
        for i in range(mask.shape[0]):
            for j in range(mask.shape[1]):
                a = float(advantages[i, j])
                want = a - zeta * abs(a) * (float(logprobs[i, j]) + float(entropy[i, j])) if mask[i, j] else 0.0
                assert float(ours[i, j]) == pytest.approx(want, rel=1e-13, abs=1e-15)
    # the correction has the sign of S = p (H + log p): likely tokens lose advantage, unlikely ones gain it
    shift = repo_r_advantages(advantages, logprobs, entropy, mask, zeta=0.1) - advantages
    s = logprobs.exp() * (entropy + logprobs)
    moved = mask & (advantages != 0) & (s != 0)
    assert bool((torch.sign(shift[moved]) == -torch.sign(s[moved])).all())


def test_repo_r_zeta_doubles_below_and_halves_above_the_initial_entropy():
    assert repo_r_zeta(0.05, 0.4, 0.5) == 0.1
    assert repo_r_zeta(0.05, 0.6, 0.5) == 0.025
    assert repo_r_zeta(0.05, 0.5, 0.5) == 0.05
    assert repo_r_zeta(0.8, 0.1, 0.5, zeta_max=1.0) == 1.0
    assert repo_r_zeta(1e-4, 0.9, 0.5, zeta_min=1e-4) == 1e-4

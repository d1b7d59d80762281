"""Our advantage estimators and KL estimators against verl's ``core_algos`` (the version ``.ci/verl-oracle.txt``
pins), on random float64 cases.

Skipped unless ``LIT_ENTROPY_VERL_DIR`` holds verl (``tests/_verl.py``; ``.ci/run`` installs it). Cases: groups of
2 to 8 samples, binary rewards (ties, all-equal groups, one forced in every case), continuous rewards, right-padded
and holed masks (verl skips observation tokens as we skip invalid ones), finite garbage at invalid positions.

Names: ``grpo`` = ``compute_grpo_outcome_advantage`` (``scale: group`` = ``norm_adv_by_std_in_grpo=True``, verl's
epsilon 1e-6 on the unbiased std as ours; ``scale: none`` = ``False``; ``scale: batch`` has no verl counterpart);
``remax`` = ``compute_remax_outcome_advantage`` (the greedy rewards given per row);
``rloo``, ``reinforce_plus_plus``, ``reinforce_plus_plus_baseline`` = verl's estimators of the same names, groups
given to verl as an ``index`` array; ``gae`` = ``compute_gae_advantage_return`` (whitened advantages, as our
``whiten_advantages: true``; compared on the valid tokens, where verl's returns hold values, ours 0 elsewhere).
REINFORCE++ with the KL in the reward: verl's ``kl_penalty(old, ref, "kl") * mask`` subtracted by ``compute_rewards``'
convention (``kl_coef * k1``), ours the same k1 passed as ``kl`` with ``kl_coef``; the gamma is verl's
``AlgoConfig.gamma``. Our training step never puts the KL in the reward (docs/differences.md): this compares the
estimator. Groups of 1 are not compared: ours refuses them for every group estimator (verl keeps the raw reward).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _verl import load_verl

from lit_entropy.functional import ADVANTAGE_ESTIMATORS, kl_penalty, outcome_token_rewards

pytestmark = pytest.mark.verl
VERL = load_verl()
F64 = torch.float64
SEEDS = range(40)
CLOSE = {"rtol": 1e-6, "atol": 1e-9}  # verl adds 1e-8 to counts and variances; an all-equal group gives it ~1e-11


def make_case(seed: int, *, min_tokens: int = 1) -> dict:
    """Rewards ``[N]`` in groups, an outcome-reward layout ``[N, T]``, a mask, per-token values and log-probs."""
    g = torch.Generator().manual_seed(seed)
    group = int(torch.randint(2, 9, (1,), generator=g))
    prompts = int(torch.randint(1, 6, (1,), generator=g))
    n, t = group * prompts, int(torch.randint(2, 9, (1,), generator=g))
    if seed % 3 == 0:
        rewards = torch.rand(n, generator=g, dtype=F64)
    else:  # 0/1 correctness (ties, all-equal groups) with a shaped value now and then
        rewards = (torch.rand(n, generator=g) < 0.5).to(F64) + (seed % 3 == 2) * 0.1
    rewards[:group] = rewards[0]  # one all-equal group
    lengths = torch.randint(min_tokens, t + 1, (n,), generator=g)
    mask = torch.arange(t) < lengths.unsqueeze(-1)
    if seed % 2:
        holes = torch.rand(n, t, generator=g) < 0.25
        holes[:, 0] = False
        mask &= ~holes
    garbage = 3 * torch.randn(3, n, t, generator=g, dtype=F64)
    return {
        "group": group,
        "rewards": rewards,
        "token_rewards": outcome_token_rewards(rewards, mask),
        "dense_rewards": torch.where(mask, torch.randn(n, t, generator=g, dtype=F64), garbage[0]),
        "values": torch.where(mask, torch.randn(n, t, generator=g, dtype=F64), garbage[1]),
        "old": torch.where(mask, -3 * torch.rand(n, t, generator=g, dtype=F64), garbage[2]),
        "ref": -3 * torch.rand(n, t, generator=g, dtype=F64),
        "mask": mask,
        "index": np.repeat(np.arange(prompts), group).astype(str),  # verl's uid strings
    }


def on_mask(ours: torch.Tensor, theirs: torch.Tensor, mask: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(ours[mask], theirs[mask], **CLOSE, msg=lambda m: f"{what}: {m}")
    assert not ours[~mask].any(), f"{what}: ours are not 0 at invalid positions"


@pytest.mark.parametrize("scale", ["group", "none"])
def test_grpo_equals_verls(scale):
    for seed in SEEDS:
        case = make_case(seed)
        mask = case["mask"]
        ours, _ = ADVANTAGE_ESTIMATORS["grpo"](case["token_rewards"], mask, group_size=case["group"], scale=scale)
        theirs, _ = VERL.core_algos.compute_grpo_outcome_advantage(
            case["token_rewards"].clone(), mask.to(F64), case["index"], norm_adv_by_std_in_grpo=scale == "group"
        )
        on_mask(ours, theirs, mask, f"grpo scale={scale} seed={seed}")
        assert not ours[: case["group"]].any(), "an all-equal group gets exactly 0"


@pytest.mark.parametrize("name", ["rloo", "reinforce_plus_plus_baseline"])
def test_group_baseline_estimators_equal_verls(name):
    verl_fn = getattr(VERL.core_algos, f"compute_{name}_outcome_advantage")
    for seed in SEEDS:
        case = make_case(seed, min_tokens=2)  # verl's batch whitening refuses a single valid token
        mask = case["mask"]
        ours, returns = ADVANTAGE_ESTIMATORS[name](case["token_rewards"], mask, group_size=case["group"])
        theirs, _ = verl_fn(case["token_rewards"].clone(), mask.to(F64), case["index"], config=VERL.AlgoConfig())
        on_mask(ours, theirs, mask, f"{name} seed={seed}")
        assert returns is None


@pytest.mark.parametrize("kl_coef", [0.0, 0.05])
@pytest.mark.parametrize("gamma", [1.0, 0.9, 0.0])
def test_reinforce_plus_plus_equals_verls(gamma, kl_coef):
    """Batch-whitened discounted returns, with (k1, verl's ``kl_penalty`` type ``kl``) and without the KL in the
    reward; verl's rewards are built by its own ``kl_penalty`` and ``compute_rewards``-style subtraction."""
    core = VERL.core_algos
    for seed in SEEDS:
        case = make_case(seed, min_tokens=2)
        mask, old, ref = case["mask"], case["old"], case["ref"]
        scores = case["token_rewards"] + torch.where(mask, 0.0, case["dense_rewards"])  # garbage off the mask
        ours, _ = ADVANTAGE_ESTIMATORS["reinforce_plus_plus"](
            scores, mask, group_size=1, gamma=gamma, kl=kl_penalty(old, ref, "k1"), kl_coef=kl_coef
        )
        verl_rewards = scores - kl_coef * core.kl_penalty(old, ref, "kl") * mask.to(F64)
        theirs, _ = core.compute_reinforce_plus_plus_outcome_advantage(
            verl_rewards, mask.to(F64), config=VERL.AlgoConfig(gamma=gamma)
        )
        where = f"reinforce_plus_plus gamma={gamma} kl_coef={kl_coef} seed={seed}"
        if (
            ours.abs().max() < 1e-9
        ):  # every return equal: verl's 1e-8 in masked_mean's count, amplified 1e4 by the whitening
            assert theirs[mask].abs().max() < 1e-4, where
            continue
        on_mask(ours, theirs, mask, where)


@pytest.mark.parametrize(("gamma", "lam"), [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.0, 0.5)])
def test_gae_equals_verls(gamma, lam):
    """Dense token rewards and values (garbage off the mask): whitened advantages and returns on the valid tokens."""
    for seed in SEEDS:
        case = make_case(seed, min_tokens=2)
        mask, rewards, values = case["mask"], case["dense_rewards"], case["values"]
        ours, returns = ADVANTAGE_ESTIMATORS["gae"](
            rewards, mask, group_size=1, values=values, gamma=gamma, lam=lam, whiten_advantages=True
        )
        theirs, verl_returns = VERL.core_algos.compute_gae_advantage_return(
            rewards, values, mask.to(F64), gamma=gamma, lam=lam
        )
        on_mask(ours, theirs, mask, f"gae advantages gamma={gamma} lam={lam} seed={seed}")
        on_mask(returns, verl_returns, mask, f"gae returns gamma={gamma} lam={lam} seed={seed}")


@pytest.mark.parametrize(
    ("ours_kind", "verl_kind"), [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl"), ("abs", "abs")]
)
@pytest.mark.parametrize("straight_through", [False, True])
def test_kl_estimators_equal_verls(ours_kind, verl_kind, straight_through):
    """Value and gradient of each KL estimator (``+``: k2's gradient, straight through), far tokens included."""
    suffix = "+" if straight_through else ""
    for seed in SEEDS:
        g = torch.Generator().manual_seed(seed)
        logprobs = -3 * torch.rand(5, 7, generator=g, dtype=F64)
        ref = logprobs + torch.randn(5, 7, generator=g, dtype=F64) * (0.3 if seed % 2 else 4.0)
        mine, theirs = logprobs.clone().requires_grad_(True), logprobs.clone().requires_grad_(True)
        value = kl_penalty(mine, ref, ours_kind + suffix)
        verl_value = VERL.core_algos.kl_penalty(theirs, ref, verl_kind + suffix)
        torch.testing.assert_close(value, verl_value, rtol=1e-12, atol=1e-12)
        value.sum().backward()
        verl_value.sum().backward()
        torch.testing.assert_close(mine.grad, theirs.grad, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------- the peers' newer estimators (issue 38.2)
@pytest.mark.parametrize("scale", ["group", "none"])
def test_grpo_passk_equals_verls(scale):
    """Only each group's best response learns, ``r_max - r_second`` (over the group std under ``group``)."""
    for seed in SEEDS:
        case = make_case(seed)
        mask, rewards = case["mask"], case["rewards"]
        ours, _ = ADVANTAGE_ESTIMATORS["grpo_passk"](case["token_rewards"], mask, group_size=case["group"], scale=scale)
        config = VERL.AlgoConfig(norm_adv_by_std_in_grpo=scale == "group")
        theirs, _ = VERL.core_algos.compute_grpo_passk_outcome_advantage(
            case["token_rewards"].clone(), mask.to(F64), case["index"], config=config
        )
        # a tied best has gap 0: the whole group gets 0 whichever tied response torch.topk calls the best
        on_mask(ours, theirs, mask, f"grpo_passk scale={scale} seed={seed}")
        grouped = rewards.reshape(-1, case["group"])
        assert int((ours.sum(-1) != 0).sum()) <= grouped.shape[0], "at most one response per group learns"


def test_opo_equals_verls():
    """OPO: ``r`` minus the group's length-weighted mean reward."""
    for seed in SEEDS:
        case = make_case(seed)
        mask = case["mask"]
        ours, _ = ADVANTAGE_ESTIMATORS["opo"](case["token_rewards"], mask, group_size=case["group"])
        theirs, _ = VERL.core_algos.compute_opo_outcome_advantage(
            case["token_rewards"].clone(), mask.to(F64), case["index"], config=VERL.AlgoConfig()
        )
        on_mask(ours, theirs, mask, f"opo seed={seed}")


@pytest.mark.parametrize("components", [0, 1, 3])
def test_gdpo_equals_verls(components):
    """GDPO: each reward component normalised in its group, the weighted sum whitened over the batch's tokens;
    ``components=0``: no components given (verl's fallback, the reward as the one component)."""
    compared = 0
    for seed in SEEDS:
        case = make_case(seed, min_tokens=2)  # verl's masked_whiten refuses a single valid token
        mask, n = case["mask"], case["rewards"].shape[0]
        g = torch.Generator().manual_seed(seed)
        parts = torch.randint(0, 3, (n, components), generator=g).to(F64) if components else None
        weights = [0.5, 1.0, 2.0][:components] if components else None
        ours, _ = ADVANTAGE_ESTIMATORS["gdpo"](
            case["token_rewards"], mask, group_size=case["group"], reward_components=parts, reward_weights=weights
        )
        if components:
            keys = [f"c{k}" for k in range(components)]
            config = VERL.AlgoConfig(gdpo_reward_keys=keys, gdpo_reward_weights=weights)
            prompt = torch.zeros(n, 2, dtype=torch.long)
            batch = {
                "prompts": prompt,
                "attention_mask": torch.cat([torch.ones(n, 2, dtype=torch.long), mask.long()], -1),
            }
            non_tensor = {key: parts[:, k].numpy() for k, key in enumerate(keys)}
            # verl puts each component at position (valid tokens - 1): right-padded masks only, as its rollouts
            right = torch.arange(mask.shape[1]) < mask.sum(-1, keepdim=True)
            if not torch.equal(right, mask):
                continue
            theirs, _ = VERL.core_algos.compute_gdpo_outcome_advantage(
                case["token_rewards"].clone(), mask.to(F64), case["index"], config=config,
                non_tensor_batch=non_tensor, batch=batch,
            )  # fmt: skip
        else:
            theirs, _ = VERL.core_algos.compute_gdpo_outcome_advantage(
                case["token_rewards"].clone(), mask.to(F64), case["index"]
            )
        where = f"gdpo components={components} seed={seed}"
        if components:  # verl holds the components in float32
            torch.testing.assert_close(
                ours[mask], theirs.to(F64)[mask], rtol=1e-5, atol=1e-6, msg=lambda m, w=where: f"{w}: {m}"
            )
            compared += 1
        else:
            on_mask(ours, theirs.to(F64), mask, where)
    assert compared >= 10 or not components


def test_remax_equals_verls():
    """ReMax: each sample's reward minus its prompt's greedy-completion reward (given per row, as verl's
    ``reward_baselines`` after its batch repeat); groups of 1 too (the paper's one sample per prompt)."""
    for seed in SEEDS:
        case = make_case(seed)
        mask, n, group = case["mask"], case["rewards"].shape[0], case["group"] if seed % 4 else 1
        g = torch.Generator().manual_seed(seed)
        greedy = torch.rand(n // group, generator=g, dtype=F64) * (seed % 3 != 1)  # 0 baselines now and then
        baselines = greedy.repeat_interleave(group)
        ours, _ = ADVANTAGE_ESTIMATORS["remax"](
            case["token_rewards"], mask, group_size=group, reward_baselines=baselines
        )
        theirs, _ = VERL.core_algos.compute_remax_outcome_advantage(
            case["token_rewards"].clone(), baselines.clone(), mask.to(F64), config=VERL.AlgoConfig()
        )
        on_mask(ours, theirs, mask, f"remax seed={seed}")

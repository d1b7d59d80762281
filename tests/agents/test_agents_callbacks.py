"""Environment tokens never reach a token callback's statistics: inserting environment columns with extreme values
(mask False, as a multi-turn rollout has them) leaves every callback's output on the policy tokens unchanged."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.callbacks import (
    REPOR,
    STARE,
    AdaptiveEntropyBonus,
    AdvantageReweighting,
    ClipCov,
    Entrocraft,
    EntropyDiscriminatorClipping,
    EntropyDynamicsMonitor,
    HighEntropySelection,
    KLCov,
    RandomNegativeMasking,
    SpuriousTokenSilencing,
    UnlikelinessReward,
)
from lit_entropy.protocol import TokenMaskContext

ROWS, COLS, GROUP = 8, 10, 4
#: Where environment columns go in the widened batch (before these policy columns) and how many.
ENV_AT = {2: 3, 6: 2, COLS: 4}


def _policy_only(seed: int = 0) -> TokenMaskContext:
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn(ROWS, 1, generator=gen, dtype=torch.float64).expand(ROWS, COLS).contiguous()
    lengths = torch.randint(4, COLS + 1, (ROWS,), generator=gen)
    return TokenMaskContext(
        mask=torch.arange(COLS).unsqueeze(0) < lengths.unsqueeze(1),
        advantages=adv,
        rewards=(torch.rand(ROWS, generator=gen, dtype=torch.float64) > 0.5).double(),
        discriminator=0.3 * torch.randn(ROWS, COLS, generator=gen, dtype=torch.float64),
        policy_average=0.05 * torch.randn(ROWS, COLS, generator=gen, dtype=torch.float64),
        entropy=2 * torch.rand(ROWS, COLS, generator=gen, dtype=torch.float64),
        old_logprobs=-4 * torch.rand(ROWS, COLS, generator=gen, dtype=torch.float64) ** 2,
    )


def _policy_columns() -> torch.Tensor:
    """Index of each policy column in the widened batch."""
    out, shift = [], 0
    for col in range(COLS):
        shift += ENV_AT.get(col, 0)
        out.append(col + shift)
    return torch.tensor(out)


def _with_environment(context: TokenMaskContext) -> TokenMaskContext:
    """``context`` with environment columns inserted: masked out, every statistic extreme there."""
    width = COLS + sum(ENV_AT.values())
    cols = _policy_columns()
    extreme = {"advantages": 1e3, "discriminator": -1e3, "policy_average": 1e3, "entropy": 1e3, "old_logprobs": -1e3}
    fields = {}
    for name, value in extreme.items():
        wide = torch.full((ROWS, width), value, dtype=torch.float64)
        wide[:, cols] = getattr(context, name)
        fields[name] = wide
    mask = torch.zeros(ROWS, width, dtype=torch.bool)
    mask[:, cols] = context.mask
    return TokenMaskContext(mask=mask, rewards=context.rewards, **fields)


class _Module:
    """What the callbacks ask of a module outside a trainer."""

    def group_size(self):
        return GROUP

    def loss_coefficients(self):
        return {"entropy_coef": 0.01}


CALLBACKS = {
    "clip_b": lambda: EntropyDiscriminatorClipping("clip_b", mu=0.5),
    "clip_v": lambda: EntropyDiscriminatorClipping("clip_v", mu=0.5),
    "clip_cov": lambda: ClipCov(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=10.0, seed=2),
    "kl_cov": lambda: KLCov(kl_cov_ratio=0.2),
    "high_entropy_80_20": lambda: HighEntropySelection(rho=0.2),
    "random_negative": lambda: RandomNegativeMasking(mu=1.0, seed=5),
    "s2t": lambda: SpuriousTokenSilencing(prob_threshold=0.2, entropy_quantile=0.8),
    "stare": lambda: STARE(),
    "entrocraft": lambda: Entrocraft(total_batches=10),
    "reweighting": lambda: AdvantageReweighting(),
    "unlikeliness": lambda: UnlikelinessReward(group_size=GROUP),
    "repo_r": lambda: REPOR(),
    "adaptive_entropy": lambda: AdaptiveEntropyBonus(),
    "monitor": lambda: EntropyDynamicsMonitor(),
}


def _outputs(callback, context):
    """Everything the callback gives the module for this batch, plus the metrics it computed."""
    module, out = _Module(), {}
    for method in ("token_advantages", "keep_mask", "token_penalty", "loss_coefficients"):
        if callable(getattr(callback, method, None)):
            out[method] = getattr(callback, method)(None, module, context)
    if isinstance(callback, EntropyDynamicsMonitor):
        callback.observe_keep_mask(None, module, context, context.mask)
    return out, dict(callback.last_metrics)


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_environment_tokens_change_no_callback_output_on_policy_tokens(name):
    narrow = _policy_only()
    wide = _with_environment(narrow)
    cols = _policy_columns()
    reference, reference_metrics = _outputs(CALLBACKS[name](), narrow)
    got, metrics = _outputs(CALLBACKS[name](), wide)
    assert reference.keys() == got.keys() and (reference or reference_metrics)
    for key, value in reference.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            assert torch.equal(got[key][:, cols][narrow.mask], value[narrow.mask]), key
        else:
            assert got[key] == pytest.approx(value), key
    assert metrics == pytest.approx(reference_metrics)

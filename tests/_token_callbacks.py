"""The token callbacks the tests build, and a random token context to run them on (shared by the callback and
agent tests)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from lit_entropy import callbacks as cb
from lit_entropy.protocol import TokenMaskContext

#: The first token callbacks (Clip_B / Clip_V, the random-mask control, Clip-Cov, KL-Cov, 80/20, the adaptive
#: entropy bonus and the monitor).
CORE: tuple[type[cb.TokenCallback], ...] = (
    cb.EntropyDiscriminatorClipping,
    cb.RandomNegativeMasking,
    cb.ClipCov,
    cb.KLCov,
    cb.HighEntropySelection,
    cb.AdaptiveEntropyBonus,
    cb.EntropyDynamicsMonitor,
)
#: Every token callback class the library exports: issue 38's lineage (STARE, Entrocraft, S2T, advantage
#: reweighting, the unlikeliness reward, REPO-R), then :data:`CORE`.
CLASSES = (cb.STARE, cb.Entrocraft, cb.SpuriousTokenSilencing, cb.AdvantageReweighting, cb.UnlikelinessReward, cb.REPOR)
CLASSES += CORE


def examples(group: int) -> dict[str, Callable[[], cb.TokenCallback]]:
    """Name -> a factory of each callback (both Clip_B and Clip_V), with settings that act on a small batch of
    groups of ``group`` responses."""
    return {
        "clip_b": lambda: cb.EntropyDiscriminatorClipping("clip_b", mu=0.5),
        "clip_v": lambda: cb.EntropyDiscriminatorClipping("clip_v", mu=0.5),
        "clip_cov": lambda: cb.ClipCov(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=10.0, seed=2),
        "kl_cov": lambda: cb.KLCov(kl_cov_ratio=0.2),
        "high_entropy_80_20": lambda: cb.HighEntropySelection(rho=0.2),
        "random_negative": lambda: cb.RandomNegativeMasking(mu=1.0, seed=5),
        "s2t": lambda: cb.SpuriousTokenSilencing(prob_threshold=0.2, entropy_quantile=0.8),
        "stare": lambda: cb.STARE(),
        "entrocraft": lambda: cb.Entrocraft(total_batches=10),
        "reweighting": lambda: cb.AdvantageReweighting(),
        "unlikeliness": lambda: cb.UnlikelinessReward(group_size=group),
        "repo_r": lambda: cb.REPOR(),
        "adaptive_entropy": lambda: cb.AdaptiveEntropyBonus(),
        "monitor": lambda: cb.EntropyDynamicsMonitor(),
    }


def random_context(
    seed: int = 0, rows: int = 8, cols: int = 6, min_length: int = 2, rewards: bool = False
) -> TokenMaskContext:
    """A float64 context of ``rows`` responses of ``min_length``..``cols`` tokens: one random advantage per row,
    random discriminator, policy average, entropy and old log-probabilities (and 0/1 rewards when ``rewards``)."""
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randn(rows, 1, generator=gen, dtype=torch.float64).expand(rows, cols).contiguous()
    lengths = torch.randint(min_length, cols + 1, (rows,), generator=gen)
    extra = {"rewards": (torch.rand(rows, generator=gen, dtype=torch.float64) > 0.5).double()} if rewards else {}
    return TokenMaskContext(
        mask=torch.arange(cols).unsqueeze(0) < lengths.unsqueeze(1),
        advantages=adv,
        **extra,
        discriminator=0.3 * torch.randn(rows, cols, generator=gen, dtype=torch.float64),
        policy_average=0.05 * torch.randn(rows, cols, generator=gen, dtype=torch.float64),
        entropy=2 * torch.rand(rows, cols, generator=gen, dtype=torch.float64),
        old_logprobs=-4 * torch.rand(rows, cols, generator=gen, dtype=torch.float64) ** 2,
    )

"""The module hands finished numbers to its helpers: it owns the step's clip fractions and exports through a view."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from _metric_references import ref_clip

from lit_entropy.functional import POLICY_LOSSES
from lit_entropy.module import RFTModule
from lit_entropy.settings import LossConfig, PolicyConfig


def test_the_module_counts_each_micro_batchs_clipped_ratios(tiny_model_dir):
    module = RFTModule(PolicyConfig(tiny_model_dir), loss=LossConfig(clip_ratio_low=0.2, clip_ratio_high=0.28))
    gen = torch.Generator().manual_seed(0)
    batches = []
    for _ in range(3):  # three micro-batches of one step
        ratio = torch.exp(torch.randn(4, 5, generator=gen, dtype=torch.float64) * 0.4)
        advantages, mask = torch.randn(4, 5, generator=gen, dtype=torch.float64), torch.rand(4, 5, generator=gen) < 0.7
        _, stats = POLICY_LOSSES["ppo"](
            ratio.log(), torch.zeros_like(ratio), advantages, mask, clip_ratio_low=0.2, clip_ratio_high=0.28,
            clip_ratio_c=None, loss_agg_mode="token-mean", normalizer=None, loss_scale_factor=None,
        )  # fmt: skip
        # The module weights each micro-batch's own fractions by its loss tokens (micro-batches differ in count).
        rows = SimpleNamespace(advantages=advantages, loss_mask=mask)
        module.update_clip(SimpleNamespace(policy_stats=stats, loss_tokens=mask.sum()), rows)
        batches.append((ratio, advantages, mask))
    clip, expected = module.clip_fractions.compute(), ref_clip(batches, 0.2, 0.28)
    assert {key: float(clip[key]) for key in expected} == pytest.approx(expected)
    assert 0 < expected["low"] and 0 < expected["high"]  # the reference is not degenerate
    assert not any(isinstance(m, type(module.clip_fractions)) for m in module.dashboard.modules())


def test_export_pretrained_outside_a_run_needs_a_path(tiny_model_dir):
    module = RFTModule(PolicyConfig(tiny_model_dir))
    with pytest.raises(ValueError, match="export_pretrained needs a path"):
        module.export_pretrained()

"""EntropyDynamicsMonitor: quadrant sums against loops, realised/agreement bookkeeping, and the
prediction against the exact entropy change of a free-logit policy trained by SGD."""

from __future__ import annotations

import math

import pytest
import torch
from _free_logit_policy import FreeLogitPolicy
from lightning.pytorch import LightningModule, Trainer

from lit_entropy.callbacks.dynamics_monitor import QUADRANTS, EntropyDynamicsMonitor, quadrant_sums
from lit_entropy.protocol import TokenMaskContext


def _context(seed: int, rows: int = 12, cols: int = 7, entropy_level: float = 1.0) -> TokenMaskContext:
    gen = torch.Generator().manual_seed(seed)
    adv = torch.randint(-2, 3, (rows, 1), generator=gen).double().expand(rows, cols).contiguous()
    mask = torch.rand(rows, cols, generator=gen) < 0.8
    return TokenMaskContext(
        mask=mask,
        advantages=adv,
        discriminator=torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.2,
        policy_average=torch.randn(rows, cols, generator=gen, dtype=torch.float64) * 0.05,
        entropy=entropy_level + 0.1 * torch.rand(rows, cols, generator=gen, dtype=torch.float64),
    )


@pytest.mark.parametrize("seed", range(4))
def test_quadrant_sums_match_loops(seed):
    ctx = _context(seed)
    sums, counts = quadrant_sums(ctx.discriminator, ctx.policy_average, ctx.advantages, ctx.mask)
    ref = {q: 0.0 for q in QUADRANTS}
    ref_n = {q: 0 for q in QUADRANTS}
    rows, cols = ctx.mask.shape
    for i in range(rows):
        for j in range(cols):
            if not ctx.mask[i, j]:
                continue
            a = float(ctx.advantages[i, j])
            d = float(ctx.discriminator[i, j]) - float(ctx.policy_average[i, j])
            if a == 0 or d == 0:
                continue
            name = ("a_pos" if a > 0 else "a_neg") + ("_d_pos" if d > 0 else "_d_neg")
            ref[name] += -a * d
            ref_n[name] += 1
    for k, q in enumerate(QUADRANTS):
        assert float(sums[k]) == pytest.approx(ref[q], abs=1e-12)
        assert int(counts[k]) == ref_n[q]
    assert all(ref_n[q] > 0 for q in QUADRANTS)
    # THEORY §2 sign table: (A>0, D>0) and (A<0, D<0) lower the entropy, the other two raise it.
    assert sums[0] < 0 < sums[1] and sums[3] < 0 < sums[2]


def test_realised_change_and_running_agreement():
    monitor = EntropyDynamicsMonitor(keep_history=True)
    levels = [1.0, 1.3, 0.9, 0.95, 0.5]
    contexts = [_context(seed, entropy_level=h) for seed, h in enumerate(levels)]
    out = [monitor.observe(ctx) for ctx in contexts]
    entropies = [float(ctx.entropy[ctx.mask].mean()) for ctx in contexts]
    predicted = [
        sum(
            -float(ctx.advantages[i, j]) * (float(ctx.discriminator[i, j]) - float(ctx.policy_average[i, j]))
            for i, j in torch.nonzero(ctx.mask).tolist()
        )
        for ctx in contexts
    ]
    matches = 0
    assert "train/dynamics/realised" not in out[0]
    for t in range(1, len(levels)):
        realised = entropies[t] - entropies[t - 1]
        match = (realised > 0) == (predicted[t - 1] > 0)
        matches += match
        assert out[t]["train/dynamics/realised"] == pytest.approx(realised, abs=1e-12)
        assert out[t]["train/dynamics/sign_match"] == float(match)
        assert out[t]["train/dynamics/agreement"] == pytest.approx(matches / t)
        assert out[t]["train/dynamics/predicted"] == pytest.approx(predicted[t], abs=1e-12)
    assert 0 < matches < len(levels) - 1, "the crafted sequence has both matches and misses"
    assert len(monitor.history) == len(levels)


def test_state_dict_resumes_the_comparison():
    contexts = [_context(seed, entropy_level=h) for seed, h in enumerate([1.0, 0.7, 0.8])]
    full = EntropyDynamicsMonitor()
    first = full.observe(contexts[0])
    assert "train/dynamics/entropy" in first
    state = full.state_dict()
    expected = [full.observe(c) for c in contexts[1:]]
    resumed = EntropyDynamicsMonitor()
    resumed.load_state_dict(state)
    assert [resumed.observe(c) for c in contexts[1:]] == expected


class _NoProtocol(LightningModule):
    pass


class _NoAverage(LightningModule):
    def token_mask_fields(self):
        return frozenset({"mask", "advantages", "discriminator", "entropy"})


def test_setup_names_what_is_missing():
    with pytest.raises(TypeError, match="_NoProtocol has no token_mask_fields"):
        EntropyDynamicsMonitor().setup(None, _NoProtocol(), "fit")
    with pytest.raises(TypeError, match="policy_average"):
        EntropyDynamicsMonitor().setup(None, _NoAverage(), "fit")


def test_prediction_matches_the_realised_change_of_a_free_logit_policy():
    torch.manual_seed(0)
    module = FreeLogitPolicy()
    monitor = EntropyDynamicsMonitor(keep_history=True)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=6,
        callbacks=[monitor],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    assert module.kept == [1.0] * 6  # an observer masks nothing
    hist = monitor.history
    positions = module.logits.shape[0]
    n_tokens = module.rows * positions
    for t in range(len(hist) - 1):
        realised = hist[t + 1]["train/dynamics/realised"]
        # Every row shares the logits: the batch mean entropy is the exact mean entropy over positions.
        assert realised == pytest.approx(module.true_entropy[t + 1] - module.true_entropy[t], abs=1e-9)
        first_order = hist[t]["train/dynamics/predicted"] * module.lr / (n_tokens * positions)
        assert abs(first_order) > 1e-5
        assert realised == pytest.approx(first_order, rel=0.05), t
    assert hist[-1]["train/dynamics/agreement"] == 1.0
    for name in (
        "predicted",
        "realised",
        "agreement",
        "sign_match",
        "entropy",
        "s_mean",
        "centred_s_mean",
        *(f"predicted_{q}" for q in QUADRANTS),
    ):
        assert f"train/dynamics/{name}" in trainer.callback_metrics, name
    assert math.isfinite(float(trainer.callback_metrics["train/dynamics/centred_s_mean"]))


def test_prediction_sums_only_over_the_tokens_that_stay_in_the_loss():
    """observe(context, keep) predicts like a context whose mask is keep, but measures entropy on every token."""
    gen = torch.Generator().manual_seed(3)
    mask = torch.rand(4, 6, generator=gen) < 0.9
    keep = mask & (torch.rand(4, 6, generator=gen) < 0.6)
    fields = {
        "advantages": torch.randn(4, 1, generator=gen).expand(4, 6).contiguous(),
        "discriminator": torch.randn(4, 6, generator=gen),
        "policy_average": 0.1 * torch.randn(4, 6, generator=gen),
        "entropy": torch.rand(4, 6, generator=gen),
    }
    with_keep = EntropyDynamicsMonitor().observe(TokenMaskContext(mask=mask, **fields), keep)
    as_mask = EntropyDynamicsMonitor().observe(TokenMaskContext(mask=keep, **fields))
    full = EntropyDynamicsMonitor().observe(TokenMaskContext(mask=mask, **fields))
    for key in ("train/dynamics/predicted", "train/dynamics/predicted_a_neg_d_neg"):
        assert with_keep[key] == pytest.approx(as_mask[key])
    assert with_keep["train/dynamics/entropy"] == pytest.approx(full["train/dynamics/entropy"])
    assert with_keep["train/dynamics/predicted"] != pytest.approx(full["train/dynamics/predicted"])


class _WithLoss(LightningModule):
    def __init__(self, policy_loss: str) -> None:
        super().__init__()
        self.settings = type("S", (), {"loss": type("L", (), {"policy_loss": policy_loss})()})()

    def token_mask_fields(self):
        return EntropyDynamicsMonitor.required_fields


@pytest.mark.parametrize(
    "name", ["ppo", "gspo", "gspo_token", "gmpo", "cispo", "sapo", "dppo_tv", "dppo_kl", "ce_gppo"]
)
def test_setup_covers_the_registered_first_order_losses_silently(name, recwarn):
    monitor = EntropyDynamicsMonitor()
    monitor.setup(None, _WithLoss(name), "fit")
    assert monitor.covers_loss is True
    assert not [w for w in recwarn if "EntropyDynamicsMonitor" in str(w.message)]


def test_setup_flags_a_loss_registered_without_first_order_entropy():
    from lit_entropy.functional.registry import POLICY_LOSSES, register_policy_loss

    register_policy_loss("test_monitor_unknown_loss")(lambda *a, **k: None)
    try:
        monitor = EntropyDynamicsMonitor()
        with pytest.warns(UserWarning, match="policy_loss='test_monitor_unknown_loss' was not registered with first"):
            monitor.setup(None, _WithLoss("test_monitor_unknown_loss"), "fit")
        assert monitor.covers_loss is False
    finally:
        POLICY_LOSSES.unregister("test_monitor_unknown_loss")

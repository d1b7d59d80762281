"""``python -m scripts.docs.lens_figure`` (issue 38 §3): its numbers against the callbacks' own masks and advantages,
recounted by a loop in float64; the figure is written; docs/theory.md holds the committed JSON's table."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch

from lit_entropy import protocol
from scripts.docs import lens_figure

# The embedded model at one step is near-uniform for some tokens: the health warning is not what this checks.
pytestmark = pytest.mark.filterwarnings("ignore:lit_entropy. the policy samples uniformly")
SMALL = {
    "data": {"batch_size": 4, "num_train_examples": 16, "num_val_examples": 8, "val_batch_size": 8},
    "model": {"sampling": {"num_samples": 4, "temperature": 1.0, "max_new_tokens": 6}},
}


def _recount(experience, keep, advantages) -> dict[str, float]:
    """The JSON's numbers by a loop over the response tokens, from a keep mask and advantages."""
    out = dict.fromkeys(("masked", "reweighted", "reweighted_up", "dh_grpo", "dh", "dh_removed", "dh_reweighting"), 0.0)
    mask = experience.response_mask
    n = int(mask.sum())
    for row, col in mask.nonzero().tolist():
        a = float(experience.advantages[row, col])
        new = float(advantages[row, col])
        centred = float(experience.discriminator[row, col]) - float(experience.policy_average[row, col])
        out["dh_grpo"] += -a * centred / n
        if not keep[row, col]:
            out["masked"] += 1
            out["dh_removed"] += -a * centred / n
            continue
        out["dh"] += -new * centred / n
        if abs(new - a) > 1e-9:
            out["reweighted"] += 1
            out["reweighted_up"] += abs(new) > abs(a)
            out["dh_reweighting"] += -(new - a) * centred / n
    out["tokens"] = float(n)
    return out


def test_the_lens_numbers_are_the_callbacks_own_masks_and_advantages(tmp_path):
    numbers, experience, shaped, module = lens_figure.run_lens(1, SMALL)
    trainer = SimpleNamespace(max_steps=lens_figure.RUN_STEPS)
    assert list(numbers["methods"]) == list(lens_figure.METHODS)
    assert experience.policy_average is not None and experience.response_mask.any()
    for name, config in lens_figure.METHODS.items():
        if config is None:
            keep, advantages = experience.response_mask, experience.advantages
        else:  # the method's callback asked directly, fresh, on GRPO's batch
            callback = lens_figure.method_callback(config)
            context = experience.token_context()
            if isinstance(callback, protocol.TokenAdvantageProvider):
                advantages = callback.token_advantages(trainer, module, context).masked_fill(~context.mask, 0.0)
            else:
                advantages = experience.advantages
            context = context.with_row_tensors({"advantages": advantages})
            keep = context.mask.clone()
            if isinstance(callback, protocol.TokenMaskProvider):
                keep &= callback.keep_mask(trainer, module, context)
        assert torch.equal(shaped[name].loss_mask & experience.response_mask, keep & experience.response_mask), name
        expected = _recount(experience, keep, advantages)
        assert numbers["methods"][name] == pytest.approx(expected, abs=1e-9), name
        m = numbers["methods"][name]
        assert m["dh"] == pytest.approx(m["dh_grpo"] - m["dh_removed"] + m["dh_reweighting"], abs=1e-9)
    out = tmp_path / "lens.png"
    lens_figure.draw(experience, shaped, numbers, out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_docs_theory_holds_the_committed_lens_table():
    numbers = json.loads(lens_figure.NUMBERS.read_text())
    assert numbers["steps"] == 30 and list(numbers["methods"]) == list(lens_figure.METHODS)
    assert lens_figure.check_docs(numbers), "run python -m scripts.docs.lens_figure --update-docs"
    assert lens_figure.FIGURE.is_file() and "figures/lens.png" in lens_figure.THEORY.read_text()

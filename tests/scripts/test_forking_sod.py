"""scripts/forking_sod.py and scripts/forking_controls.py: the count replay, exact evaluation, a 2-step pipeline."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


_load = load_script


def test_replayed_count_masking_masks_the_replayed_counts_among_negative_tokens():
    controls = _load("forking_controls")
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(12, 9, generator=gen) > 0.2
    mask[:, 0] = True
    adv = torch.randn(12, 1, generator=gen).expand(12, 9).contiguous()
    ctx = SimpleNamespace(mask=mask, advantages=adv)
    trainer = SimpleNamespace(global_step=4)  # the batch of step 5
    neg = mask & (adv < 0)
    n_neg_first, n_neg_rest = int(neg[:, 0].sum()), int(neg[:, 1:].sum())
    counts = {5: {"strategy": 2, "exec": 7}}
    for by_role in (False, True):
        control = controls.ReplayedCountMasking(counts, by_role=by_role, seed=1)
        keep = control.keep_mask(trainer, None, ctx)
        dropped = mask & ~keep
        assert not (keep & ~mask).any() and not (dropped & ~neg).any()  # only A < 0 tokens are masked
        assert int(dropped.sum()) == 9 and control.shortfall == 0
        if by_role:
            assert int(dropped[:, 0].sum()) == 2 and int(dropped[:, 1:].sum()) == 7
    # more than there are: every candidate of the role goes, the rest is the shortfall
    control = controls.ReplayedCountMasking({5: {"strategy": n_neg_first + 3, "exec": 0}}, by_role=True)
    keep = control.keep_mask(trainer, None, ctx)
    assert int((mask & ~keep)[:, 0].sum()) == n_neg_first and control.shortfall == 3 and n_neg_rest > 0


def test_evaluate_matches_token_by_token_probabilities():
    sod = _load("forking_sod")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    policy = AutoModelForCausalLM.from_pretrained(sod.EXP / "model", dtype=torch.float64)
    tok = AutoTokenizer.from_pretrained(sod.EXP / "model")
    rows = sod.evaluate(policy, tok, step=0, temperature=0.7)
    tests = sod.test_rows()
    for i in (0, 1, 5):  # row 1 has two correct responses (b = 0)
        total = 0.0
        for answer in tests[i]["answer"].split("|"):
            ids = tok(tests[i]["prompt"], add_special_tokens=False)["input_ids"]
            target = tok(answer, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
            logp = 0.0
            for t in target:  # one unpadded forward per token: an independent re-derivation
                logits = policy(input_ids=torch.tensor([ids])).logits[0, -1].double() / 0.7
                logp += float(torch.log_softmax(logits, -1)[t])
                ids = ids + [t]
            total += math.exp(logp)
        assert math.log(total) == pytest.approx(float(rows[i]["logp"]), abs=1e-5)
    assert "|" in tests[1]["answer"]


def test_two_step_pipeline_replays_clip_b_counts(tmp_path):
    sod = _load("forking_sod")
    sod.main(
        [
            "--exp",
            str(tmp_path),
            "--run",
            "--arms",
            "clip_b,replay_mask",
            "--seeds",
            "0",
            "--steps",
            "2",
            "--eval-every",
            "1",
        ]
    )
    runs = {name: tmp_path / "per_run" / f"{name}__s0" for name in ("clip_b", "replay_mask")}
    train = {k: list(csv.DictReader((d / "train.csv").open())) for k, d in runs.items()}
    for a, b in zip(train["clip_b"], train["replay_mask"], strict=True):
        total = int(a["masked_n_strategy"]) + int(a["masked_n_exec"])
        assert int(b["masked_n_strategy"]) + int(b["masked_n_exec"]) == total
    evals = list(csv.DictReader((runs["clip_b"] / "eval.csv").open()))
    assert sorted({int(r["step"]) for r in evals}) == [0, 1, 2] and len(evals) == 3 * 150
    done = json.loads((runs["replay_mask"] / "done.json").read_text())
    assert done["steps"] == 2 and done["replay_shortfall"] == 0


def test_experiment_arms_and_run_order():
    sod = _load("forking_sod")
    design = sod.EXPERIMENTS["sod_clipv"]
    for overlay in design.arms.values():
        assert (sod.CONFIGS / overlay).exists()
    args = sod.cli_args("clip_v_rescaled", 3, 400, Path("/tmp/x"), design.arms)
    assert str(sod.CONFIGS / "clip_v_sod.yaml") in args and "--data.seed=3" in args
    assert str(sod.EXP / "model") in " ".join(args)  # every experiment trains C's base model
    with pytest.raises(ValueError, match="unknown arms.*sod_clipv"):
        sod.main(["--experiment", "sod_clipv", "--arms", "replay_mask", "--status"])


def test_clip_v_caps_of_the_amendment_at_this_batch():
    """1e-4 rounds up to 1 token per batch here (not 0); the rescaled cap allows ~82 (clip_v_sod.yaml's rule)."""
    import yaml

    from lit_entropy.functional.clipping import cap_count

    sod = _load("forking_sod")
    fracs = {}
    for arm in ("clip_v", "clip_v_rescaled"):
        cfg = yaml.safe_load((sod.CONFIGS / sod.EXPERIMENTS["sod_clipv"].arms[arm]).read_text())
        (cb,) = cfg["trainer"]["callbacks"]
        assert cb["init_args"]["method"] == "clip_v" and cb["init_args"]["mu"] == 8.5
        fracs[arm] = cb["init_args"]["max_frac"]
    n = 128 * 9  # 16 prompts x 8 samples, responses of <= 10 tokens
    assert cap_count(n, fracs["clip_v"]) == 1 and math.floor(1e-4 * n) == 0
    assert fracs["clip_v_rescaled"] == pytest.approx(1e-4 * 7168 / 10, abs=5e-4)
    assert cap_count(n, fracs["clip_v_rescaled"]) == math.floor(0.072 * n) == 82

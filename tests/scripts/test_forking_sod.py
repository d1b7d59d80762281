"""scripts/studies/sod/run.py and scripts/studies/controls.py: the count replay, exact evaluation, a 2-step pipeline."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _scripts import load_script
from _study_runs import assert_replays_counts

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


_load = load_script


def test_replayed_count_masking_masks_the_replayed_counts_among_negative_tokens():
    controls = _load("scripts.studies.controls")
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
    sod = _load("scripts.studies.sod.run")
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
    sod = _load("scripts.studies.sod.run")
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
    assert_replays_counts(runs["clip_b"], runs["replay_mask"])
    evals = list(csv.DictReader((runs["clip_b"] / "eval.csv").open()))
    assert sorted({int(r["step"]) for r in evals}) == [0, 1, 2] and len(evals) == 3 * 150
    done = json.loads((runs["replay_mask"] / "done.json").read_text())
    assert done["steps"] == 2 and done["replay_shortfall"] == 0


def test_experiment_arms_and_run_order():
    sod = _load("scripts.studies.sod.run")
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

    from lit_entropy.functional.selection import cap_count

    sod = _load("scripts.studies.sod.run")
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


def test_robustness_experiment_runs_unit_by_unit_on_its_bases():
    """Experiment E: (base, seed) units; a unit's four arms consecutive, seed-major then base; each base's model."""
    sod = _load("scripts.studies.sod.run")
    design = sod.EXPERIMENTS["sod_robust"]
    keys = sod.planned(tuple(design.arms), design.seeds, design)
    assert len(keys) == design.planned_runs == 96
    arms = ["grpo", "clip_b", "clip_b_mu2", "clip_b_mu3"]
    assert keys[:12] == [(b, a, 0) for b in ("sod-s0", "sod-s1", "sod-s2") for a in arms]
    assert keys[-1] == ("sod-s2", "clip_b_mu3", 7)
    assert sod.run_name("clip_b_mu2", 3, "sod-s1") == "sod-s1__clip_b_mu2__s3" and sod.run_name("grpo", 3) == "grpo__s3"
    assert sod.model_dir(design, "sod-s0") == sod.EXP / "model"  # C's base, as it is
    args = sod.cli_args("clip_b_mu3", 5, 400, Path("/tmp/x"), design.arms, sod.model_dir(design, "sod-s2"))
    assert f"--model.policy.model_name_or_path={sod.EXPERIMENTS_DIR / 'sod_robust/models/sod-s2'}" in args
    assert str(sod.CONFIGS / "clip_b_mu3.yaml") in args and "--data.seed=5" in args
    assert sod.planned(("grpo",), (0,), sod.EXPERIMENTS["sod"]) == [(None, "grpo", 0)]
    with pytest.raises(ValueError, match="unknown bases"):
        sod.main(["--experiment", "sod_robust", "--bases", "sod-s9", "--status"])


def test_robustness_overlays_set_only_mu():
    import yaml

    sod = _load("scripts.studies.sod.run")
    arms = sod.EXPERIMENTS["sod_robust"].arms
    for arm, mu in (("clip_b_mu2", 2.0), ("clip_b", 2.5), ("clip_b_mu3", 3.0)):
        (cb,) = yaml.safe_load((sod.CONFIGS / arms[arm]).read_text())["trainer"]["callbacks"]
        assert cb["init_args"] == {"method": "clip_b", "mu": mu}


def test_base_validity_rule():
    sod = _load("scripts.studies.sod.run")
    # C's base (experiments/sod/PREREGISTRATION.md): valid
    c = {"val_self_consistency": 0.9075, "pass@64": 0.978, "pass@64_diff": 0.930, "p_R_diff": 0.25, "p_R_sum": 0.25}
    assert sod.base_failures(c) == []
    assert len(sod.base_failures({**c, "pass@64": 0.89})) == 1
    assert len(sod.base_failures({**c, "pass@64_diff": 0.49})) == 1
    assert len(sod.base_failures({**c, "val_self_consistency": 0.85})) == 1
    # learnt the rule: R likelier on diff prompts (gap 0.06) although both are in range
    assert sod.base_failures({**c, "p_R_diff": 0.30, "p_R_sum": 0.24}) == [
        "P(R) differs by 0.060 > 0.05 between classes"
    ]
    assert len(sod.base_failures({**c, "p_R_diff": 0.36, "p_R_sum": 0.34})) == 1


def test_two_step_run_of_a_named_base(tmp_path):
    sod = _load("scripts.studies.sod.run")
    argv = ["--experiment", "sod_robust", "--exp", str(tmp_path), "--bases", "sod-s0", "--arms", "clip_b_mu3"]
    sod.main([*argv, "--seeds", "0", "--steps", "2", "--eval-every", "2", "--run"])
    d = tmp_path / "per_run" / "sod-s0__clip_b_mu3__s0"
    evals = list(csv.DictReader((d / "eval.csv").open()))
    assert sorted({int(r["step"]) for r in evals}) == [0, 2] and json.loads((d / "done.json").read_text())["steps"] == 2
    assert len(list(csv.DictReader((d / "train.csv").open()))) == 2

"""scripts/studies/horizon/run.py (issue 24, experiment A): run order, exact evaluation, a 2-step pipeline."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from _scripts import load_script
from _study_runs import assert_replays_counts


def test_planned_order_gives_whole_units_first_and_clip_b_before_its_replay(tmp_path):
    hz = load_script("scripts.studies.horizon.run")
    keys = hz.planned(hz.BASES, tuple(hz.ARMS), (0, 1))
    primary = [k for k in keys if k[1] != "grpo_null"]
    assert keys[: len(primary)] == primary  # the null arm only after every primary run
    assert [k[:2] for k in primary[:6]] == [
        ("fork-s0", "grpo"),
        ("fork-s0", "clip_b"),
        ("fork-s0", "replay_mask"),
        ("fork-s1", "grpo"),
        ("fork-s1", "clip_b"),
        ("fork-s1", "replay_mask"),
    ]
    assert {k[2] for k in primary[:6]} == {0} and {k[2] for k in primary[6:]} == {1}
    for experiment, spec in hz.EXPERIMENTS.items():  # every config a run names exists
        args = hz.cli_args(("fork-s1", "clip_b", 3), spec["steps"], tmp_path, experiment)
        configs = [args[i + 1] for i, a in enumerate(args) if a == "--config"]
        assert all(Path(c).exists() for c in configs) and len(configs) == 2 + len(spec["overlays"])
        assert f"--model.policy.model_name_or_path={spec['models'] / 'fork-s1'}" in args
    with pytest.raises(ValueError, match="--arms has unknown names"):
        hz.main(["--arms", "grpo,clip_c", "--status"])


def test_evaluate_matches_token_by_token_probabilities():
    hz = load_script("scripts.studies.horizon.run")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = hz.MODELS / "fork-s1"
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64)
    tok = AutoTokenizer.from_pretrained(path)
    rows = hz.evaluate(policy, tok, step=0, temperature=0.7)
    tests = hz.test_rows()
    assert len(rows) == 64 and [r["prompt"] for r in rows] == [t["prompt"] for t in tests]
    for i in (0, 20, 63):  # classes A, B, D
        ids = tok(tests[i]["prompt"], add_special_tokens=False)["input_ids"]
        target = tok(tests[i]["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        logps = []
        for t in target:  # one unpadded forward per token: an independent re-derivation
            logits = policy(input_ids=torch.tensor([ids])).logits[0, -1].double() / 0.7
            logps.append(float(torch.log_softmax(logits, -1)[t]))
            ids = ids + [t]
        assert float(rows[i]["logp"]) == pytest.approx(math.fsum(logps), abs=1e-4)
        assert float(rows[i]["logp_first"]) == pytest.approx(logps[0], abs=1e-5)


def test_two_step_pipeline_replays_clip_b_counts(tmp_path):
    hz = load_script("scripts.studies.horizon.run")
    args = ["--exp", str(tmp_path), "--run", "--bases", "fork-s0", "--arms", "clip_b,replay_mask", "--seeds", "0"]
    hz.main([*args, "--steps", "2", "--eval-every", "1"])
    runs = {name: tmp_path / "per_run" / f"fork-s0__{name}__s0" for name in ("clip_b", "replay_mask")}
    assert len(list(csv.DictReader((runs["clip_b"] / "train.csv").open()))) == 2
    assert_replays_counts(runs["clip_b"], runs["replay_mask"])
    evals = list(csv.DictReader((runs["clip_b"] / "eval.csv").open()))
    assert sorted({int(r["step"]) for r in evals}) == [0, 1, 2] and len(evals) == 3 * 64
    done = json.loads((runs["replay_mask"] / "done.json").read_text())
    assert done["steps"] == 2 and done["replay_shortfall"] == 0 and done["code_revision"]

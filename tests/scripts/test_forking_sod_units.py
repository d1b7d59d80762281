"""Experiment E's statistics and analysis (scripts/studies/sod/multiplicity.py, scripts/studies/sod/units.py):
Holm and the exact sign-flip p against hand computations, issue 39's verdict rule, a multi-base analysis of
hand-made runs, and the generated README block against the committed runs."""

from __future__ import annotations

import math
import random
import shutil
from pathlib import Path

import pytest
from _scripts import load_script
from _study_runs import sod_eval_rows, train_row, write_run

from scripts.studies.results import run_names

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


def test_holm_against_hand_computation():
    mult = load_script("scripts.studies.sod.multiplicity")
    # sorted 0.01, 0.03, 0.04 -> 3 x 0.01 = 0.03; 2 x 0.03 = 0.06; max(0.06, 1 x 0.04) = 0.06
    assert mult.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # sorted 0.001, 0.2, 0.5 -> 0.003; 0.4; max(0.4, 0.5) = 0.5
    assert mult.holm([0.2, 0.001, 0.5]) == pytest.approx([0.4, 0.003, 0.5])
    # capped at 1, and monotone: 3 x 0.01 = 0.03; min(1, 2 x 0.6) = 1; 1
    assert mult.holm([0.6, 0.6, 0.01]) == pytest.approx([1.0, 1.0, 0.03])
    # the smallest p of C's kind (n = 8, all positive): 2/256 in a family of 3 -> 6/256 < 0.05
    assert mult.holm([2 / 256] * 3) == pytest.approx([6 / 256] * 3)
    assert mult.family_level(3) == pytest.approx(0.98333333)
    with pytest.raises(ValueError, match="m=0"):
        mult.family_level(0)


def test_sign_flip_p_is_exact_for_any_n():
    mult = load_script("scripts.studies.sod.multiplicity")
    from scripts.studies.statistics import sign_flip_test

    rng = random.Random(3)
    for n in (1, 2, 5, 9, 12):  # full enumeration where lit_entropy allows it
        d = [round(rng.gauss(0.01, 0.02), 2) for _ in range(n)]  # rounded: ties between assignments
        assert mult.sign_flip_p(d) == sign_flip_test(d)
    # n = 22 equal magnitudes, 17 positive: |sum| >= 12 iff >= 17 of one sign -> 2 * sum_{j>=17} C(22, j) / 2^22
    d = [0.01] * 17 + [-0.01] * 5
    hand = 2 * sum(math.comb(22, j) for j in range(17, 23)) / 2**22
    assert mult.sign_flip_p(d) == pytest.approx(hand, rel=1e-12)
    assert mult.sign_flip_p([0.1 + 0.001 * i for i in range(24)]) == 2 / 2**24  # all positive: the two extremes
    assert mult.sign_flip_p([0.02, -0.02]) == 1.0 and math.isnan(mult.sign_flip_p([]))


def test_issue_39_verdict_rule():
    mult = load_script("scripts.studies.sod.multiplicity")
    v = mult.corrected_verdict
    assert v(0.03, 0.20, 0.16, 0.01, 0.02) == "better" and v(-0.2, -0.03, -0.1, 0.02, 0.02) == "worse"
    # the issue's example: consistent +0.013 with the interval up to +0.021 is not "none"
    assert v(0.006, 0.021, 0.013, 0.02, 0.02) == "small, consistent positive"
    assert v(0.005, 0.015, 0.010, 0.01, 0.02) == "none"  # inside the floor
    assert v(-0.015, 0.019, 0.002, 0.5, 0.02) == "none"
    assert v(0.006, 0.021, 0.013, 0.06, 0.02) == "inconclusive"  # the corrected p does not reject
    assert v(0.01, 0.10, 0.05, 0.0625, 0.02) == "inconclusive"
    assert v(-0.05, 0.10, 0.02, 0.3, 0.02) == "inconclusive"
    assert v(float("nan"), float("nan"), 0.1, 1.0, 0.02) == "inconclusive"


def _fake_run(exp: Path, base: str, arm: str, seed: int, p: float, masked: int = 0, rev: str = "abc1234") -> None:
    """Two test prompts (sum, diff) at steps 0, 40, 80, 120 with p(correct) = p at the last three; 60 steps
    with ``masked`` strategy tokens masked at steps 1-50 and none later."""
    train = [train_row(s, (0.1, masked if s <= 50 else 0, 0.0, 128), (0.1, 0, 0.0, 128)) for s in range(1, 61)]
    write_run(exp, f"{base}__{arm}__s{seed}", sod_eval_rows(p), train, rev, seconds=120.0)


def test_units_analysis_on_hand_made_runs(tmp_path):
    an = load_script("scripts.studies.sod.analysis")
    design = an.EXPERIMENTS["sod_robust"]
    # p(correct) = avg@64 per unit; units (sod-s0, 0), (sod-s0, 1), (sod-s1, 0) complete; (sod-s2, 0) lacks an arm
    ps = {
        ("sod-s0", 0): {"grpo": 0.30, "clip_b": 0.40, "clip_b_mu2": 0.35, "clip_b_mu3": 0.31},
        ("sod-s0", 1): {"grpo": 0.40, "clip_b": 0.55, "clip_b_mu2": 0.42, "clip_b_mu3": 0.41},
        ("sod-s1", 0): {"grpo": 0.20, "clip_b": 0.32, "clip_b_mu2": 0.27, "clip_b_mu3": 0.22},
        ("sod-s2", 0): {"grpo": 0.25, "clip_b": 0.30},
    }
    for (base, seed), arms in ps.items():
        for arm, p in arms.items():
            _fake_run(tmp_path, base, arm, seed, p, masked=3 if arm.startswith("clip_b") else 0)
    summary = load_script("scripts.studies.sod.units").analyze_units(
        tmp_path, an.EXPERIMENTS["sod_robust"], "sod_robust"
    )
    assert summary["units"] == ["sod-s0 s0", "sod-s0 s1", "sod-s1 s0"]
    pooled = {(f["name"], f["metric"]): f for f in summary["families"]}
    assert set(pooled) == {("pooled", "pass@64"), ("pooled", "avg@64"), ("sod-s0", "pass@64")}  # sod-s1: 1 unit
    fam = pooled[("pooled", "avg@64")]
    assert [(t["treated"], t["control"]) for t in fam["tests"]] == list(design.comparisons)
    t = fam["tests"][1]  # clip_b - grpo
    d = [0.10, 0.15, 0.12]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    assert t["mean"] == pytest.approx(mean)
    half95, half_fam = 4.302652729749462 * sd / math.sqrt(3), 7.648803937915553 * sd / math.sqrt(3)  # scipy t.ppf
    assert (t["low95"], t["high95"]) == (pytest.approx(mean - half95), pytest.approx(mean + half95))
    assert (t["low"], t["high"]) == (pytest.approx(mean - half_fam), pytest.approx(mean + half_fam))
    # p: all 3 positive -> 2/8 each; Holm over three equal p's: 3 x 0.25 = 0.75
    assert [x["p_sign_flip"] for x in fam["tests"]] == [0.25, 0.25, 0.25]
    assert [x["p_holm"] for x in fam["tests"]] == pytest.approx([0.75] * 3)
    assert t["verdict"] == "inconclusive" and t["positive"] == 3
    m = summary["arm_means"]["sod-s0__clip_b_mu2"]
    assert m["n"] == 2 and m["masked_strategy_early"] == 3 and m["masked_per_step_strategy"] == pytest.approx(2.5)
    assert m["steps_masking_strategy"] == pytest.approx(50 / 60)
    block = (tmp_path / "readme_block.md").read_text()
    assert "Status: PROVISIONAL: 14 of the 96 pre-registered runs have finished; 3 of the 24" in block
    assert "(sod-s0 2, sod-s1 1, sod-s2 0)" in block and "Holm p = 0.7500" in block
    assert "| sod-s0 | Clip_B mu 2.0 | 2 | " in block and "| 2.5 / 3.0 | 83% |" in block
    docs = (tmp_path / "docs_block.md").read_text()
    assert "Status: PROVISIONAL" in docs and "primary, pooled: **Clip_B mu 2.5 - GRPO** pass@64 (n = 3)" in docs
    assert "Per-unit" not in docs and "| sod-s1 | GRPO | 1 |" in docs


def test_robust_block_matches_the_committed_runs(tmp_path):
    an = load_script("scripts.studies.sod.analysis")
    design = an.EXPERIMENTS["sod_robust"]
    exp = SCRIPTS / "forking" / "experiments" / design.directory
    text = an.README.read_text()
    block = text.split(f"<!-- {design.marker}:begin -->\n", 1)[1].split(f"\n<!-- {design.marker}:end -->", 1)[0]
    docs = (SCRIPTS.parent / "docs" / "study.md").read_text()
    short = docs.split(f"<!-- {design.marker}:begin -->\n", 1)[1].split(f"\n<!-- {design.marker}:end -->", 1)[0]
    if not run_names(exp):
        assert block == short == "(no runs analysed yet)"
        return
    shutil.copy(exp / "runs.parquet", tmp_path / "runs.parquet")
    load_script("scripts.studies.sod.units").analyze_units(tmp_path, an.EXPERIMENTS["sod_robust"], "sod_robust")
    assert (tmp_path / "readme_block.md").read_text().rstrip() == block
    assert (tmp_path / "docs_block.md").read_text().rstrip() == short
    for name in run_names(exp):  # every committed run is a pre-registered one
        base, arm, seed = name.split("__")
        assert base in design.bases and arm in design.arms and int(seed[1:]) in design.seeds, name

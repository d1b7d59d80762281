"""``python -m scripts.studies.reread``: the finished experiments under issue 39's rule, checked against hand
computations on made-up differences and against what the study READMEs quote from the committed runs."""

from __future__ import annotations

from scripts.studies.reread import main, reread


def _summary(diffs_by_pair: dict[tuple[str, str], list[float]], old: str = "none") -> dict:
    comparisons = []
    for (treated, control), diffs in diffs_by_pair.items():
        judged = {"diffs": diffs, "verdict": old}
        comparisons.append({"treated": treated, "control": control, "pass@64": judged, "avg@64": judged})
    return {"comparisons": comparisons}


def test_a_consistent_gain_below_the_floor_is_small_consistent_not_none() -> None:
    # 8 positive differences, mean 0.013: sign-flip p = 2/256; the 95 % t interval excludes 0 and reaches past 0.02
    diffs = [0.001, 0.002, 0.004, 0.008, 0.012, 0.020, 0.025, 0.032]  # 95 % t interval [+0.0034, +0.0226]
    tests = reread(_summary({("mask", "grpo"): diffs}))
    assert len(tests) == 2  # one comparison x two metrics: a family of 2
    t = tests[0]
    assert abs(t["mean"] - 0.013) < 1e-12
    assert t["p"] == 2 / 256
    assert t["old"] == "none" and t["new"] == "small, consistent positive"
    assert abs(t["p_holm"] - 2 * 2 / 256) < 1e-12  # both tests have p = 2/256: Holm multiplies the first by 2
    assert abs(t["level"] - 0.975) < 1e-12


def test_holm_over_twelve_tests_at_eight_units_cannot_pass_however_large_the_gain() -> None:
    big = [0.15, 0.16, 0.17, 0.15, 0.16, 0.17, 0.15, 0.16]
    tests = reread(_summary({(f"m{i}", "grpo"): big for i in range(6)}, old="better"))
    assert len(tests) == 12
    for t in tests:
        assert t["new"] == "better"
        assert abs(t["p_holm"] - 12 * 2 / 256) < 1e-12  # 0.094 > 0.05
        assert t["low"] > 0.1  # the Bonferroni interval is still far from 0 ...
        assert t["holm"] == "inconclusive"  # ... but the corrected p fails


def test_only_pooled_comparisons_form_the_family() -> None:
    summary = _summary({("clip_b", "grpo"): [0.01, 0.02, 0.03]})
    per_base = dict(summary["comparisons"][0], scope="fork-s0")
    summary["comparisons"] = [dict(summary["comparisons"][0], scope="pooled"), per_base]
    assert len(reread(summary)) == 2


def test_the_committed_runs_read_as_the_readmes_say(capsys) -> None:
    main([])
    out = capsys.readouterr().out
    # C's count-replaying mask: "none" by C's rule, small and consistent by issue 39's (README, C's reading)
    row = next(
        line
        for line in out.splitlines()
        if line.startswith("| C (sum-or-difference)") and "replay_mask - grpo | pass@64" in line
    )
    assert "| +0.013 | [+0.006, +0.021] | 0.0078 | 8/8 | none | small, consistent positive * |" in row
    assert row.endswith("| 0.0938 | inconclusive |")
    # A's Clip_B - GRPO avg@64: inconclusive either way, 1 of 10 units above 0, p 0.0039
    row = next(
        line for line in out.splitlines() if line.startswith("| A (horizon)") and "clip_b - grpo | avg@64" in line
    )
    assert "| -0.025 | [-0.064, +0.014] | 0.0039 | 1/10 | inconclusive | inconclusive |" in row

"""Smoke test of scripts/studies/dynamics/run.py --quick: every section runs and the report is complete."""

from __future__ import annotations

import json
import time

import pytest


def _load_script():
    import scripts.studies.dynamics.run as entropy_dynamics  # scripts/ is on pytest's pythonpath

    return entropy_dynamics


def test_bad_flags_name_the_flag():
    script = _load_script()
    with pytest.raises(ValueError, match="--seeds"):
        script.parse_args(["--out", "x", "--seeds", "0"])
    with pytest.raises(ValueError, match="--sections"):
        script.parse_args(["--out", "x", "--sections", "az"])


def test_quick_run_writes_report_plots_and_numbers(tmp_path):
    pytest.importorskip("matplotlib")
    script = _load_script()
    start = time.perf_counter()
    script.main(["--out", str(tmp_path), "--quick", "--threads", "1"])
    assert time.perf_counter() - start < 120  # < 60 s on an idle 2-core machine; slack for a shared one
    results = json.loads((tmp_path / "results.json").read_text())
    assert {"a", "b", "c", "d", "e", "e_summary"} <= set(results)
    # (a) the measured change converges to the exact first order as the step shrinks.
    steps = results["a"]["steps"]
    assert steps[-1]["rel_err_first_order"] < 0.2 < steps[0]["rel_err_first_order"]
    assert steps[-1]["corr_first_order"] > 0.95
    # (b) four conditions, each with an entropy trajectory; (d) masked fraction falls with mu.
    assert set(results["b"]) == {"pos_s_pos", "pos_s_neg", "neg_s_pos", "neg_s_neg"}
    for row in results["b"].values():  # --quick runs 2 seeds per condition; 'holds' counts their signs
        assert [r["seed"] for r in row["runs"]] == [0, 1] and len(row["runs"][0]["entropy"]) == 3
        assert row["holds"] == sum((r["slope_per_step"] < 0) == (row["expected"] == "down") for r in row["runs"])
        assert row["holds_change"] == sum(
            (r["entropy"][-1] < r["entropy"][0]) == (row["expected"] == "down") for r in row["runs"]
        )
    fracs = [row["frac"] for row in results["d"]["clip_b"]]
    assert fracs == sorted(fracs, reverse=True) and fracs[0] > fracs[-1]
    # (e) one run per method, with validation curves.
    for method in ("grpo", "clip_b", "clip_v"):
        (run,) = results["e"][method]
        assert run["val"] and any(k.startswith("val/avg@") for k in run["val"][-1])
    report = (tmp_path / "checks.md").read_text()
    for heading in ("(a) First order", "(b) Selective", "(c) Centred", "(d) mu sweep", "(e) GRPO vs"):
        assert heading in report
    for png in (
        "a_first_order.png",
        "b_selective_masking.png",
        "c_centred_baseline.png",
        "d_mu_sweep.png",
        "e_methods.png",
    ):
        assert (tmp_path / png).stat().st_size > 1000
        assert f"]({png})" in report

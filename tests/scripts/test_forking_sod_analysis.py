"""scripts/studies/sod/analysis.py: the pre-registered endpoint, intervals and verdicts, on hand-made runs; and
the generated block of scripts/forking/README.md matches the committed runs."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
from _scripts import load_script
from _study_runs import train_row, write_run

from scripts.studies.results import run_names

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


_load = load_script


def _fake_run(exp: Path, arm: str, seed: int, p: float, rev: str = "abc1234") -> None:
    """Two prompts (sum, diff) evaluated at steps 0, 40, 80, 120; p(correct) = p at the last three steps."""
    rows = []
    for step in (0, 40, 80, 120):
        for prompt, cls in (("1,2?", "sum"), ("5,3?", "diff")):
            q = 0.5 if step == 0 else (p if cls == "sum" else p / 2)
            rows.append(
                {
                    "step": step,
                    "temperature": 1.0,
                    "prompt": prompt,
                    "class": cls,
                    "logp": math.log(q),
                    "logp_R": math.log(0.25),
                }
            )
    train = [train_row(s, (0.4, 2, 0.1, 128), (0.02, 1, 0.01, 1000)) for s in (1, 2, 3, 4)]
    write_run(exp, f"{arm}__s{seed}", rows, train, rev)


def test_verdict_rule():
    an = _load("scripts.studies.analysis")  # the rule of A, B and C
    assert an.verdict(0.01, 0.10, 0.05, 0.01) == "better"
    assert an.verdict(-0.10, -0.03, -0.06, 0.01) == "worse"
    assert an.verdict(0.01, 0.10, 0.05, 0.0625) == "inconclusive"  # the sign-flip test does not reject
    assert an.verdict(-0.015, 0.019, 0.002, 0.5) == "none"  # inside the +-0.02 floor
    assert an.verdict(0.001, 0.010, 0.005, 0.01) == "none"  # excludes 0, below the floor
    assert an.verdict(-0.05, 0.10, 0.02, 0.3) == "inconclusive"
    assert an.verdict(float("nan"), float("nan"), 0.1, 1.0) == "inconclusive"


def test_endpoint_intervals_and_sign_flip_on_hand_made_runs(tmp_path):
    an = _load("scripts.studies.sod.analysis")
    ps = {"grpo": [0.30, 0.40, 0.50], "clip_b": [0.40, 0.45, 0.62], "replay_mask": [0.30, 0.41, 0.49]}
    for arm, values in ps.items():
        for seed, p in enumerate(values):
            _fake_run(tmp_path, arm, seed, p)
    runs = an.load_runs(tmp_path)
    # endpoint: mean over steps 40, 80, 120 of the prompt mean; the step-0 values (0.5) are not in it
    e = an.endpoint(runs[("grpo", 0)]["eval"])
    assert e["avg@64"] == pytest.approx((0.30 + 0.15) / 2)
    assert e["pass@64"] == pytest.approx((1 - 0.70**64 + 1 - 0.85**64) / 2)
    table = an.per_run_table(runs)
    c = an.compare(table, "clip_b", "grpo", [0, 1, 2])
    d = [table[f"clip_b__s{s}"]["avg@64"] - table[f"grpo__s{s}"]["avg@64"] for s in range(3)]
    mean = sum(d) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 2)
    half = 4.302652729911275 * sd / math.sqrt(3)  # t_{0.975, 2}
    assert c["avg@64"]["mean"] == pytest.approx(mean)
    assert (c["avg@64"]["low"], c["avg@64"]["high"]) == (pytest.approx(mean - half), pytest.approx(mean + half))
    assert c["avg@64"]["p_sign_flip"] == pytest.approx(2 / 8)  # all three positive: 2 of 8 sign patterns as extreme
    assert c["avg@64"]["verdict"] == "inconclusive" and c["avg@64"]["positive"] == 3


def test_analysis_refuses_mixed_revisions(tmp_path):
    an = _load("scripts.studies.sod.analysis")
    _fake_run(tmp_path, "grpo", 0, 0.3, rev="aaaaaaa")
    _fake_run(tmp_path, "clip_b", 0, 0.3, rev="bbbbbbb")
    with pytest.raises(ValueError, match="code revision"):
        an.load_runs(tmp_path)


@pytest.mark.parametrize("experiment", ["sod", "sod_clipv"])
def test_readme_block_matches_the_committed_runs(tmp_path, experiment):
    an = _load("scripts.studies.sod.analysis")
    design = an.EXPERIMENTS[experiment]
    exp = SCRIPTS / "forking" / "experiments" / design.directory
    text = an.README.read_text()
    block = text.split(f"<!-- {design.marker}:begin -->\n", 1)[1].split(f"\n<!-- {design.marker}:end -->", 1)[0]
    if not run_names(exp):
        assert block == "(no runs analysed yet)"
        return
    shutil.copy(exp / "runs.parquet", tmp_path / "runs.parquet")
    an.analyze(tmp_path, experiment=experiment)
    assert (tmp_path / "readme_block.md").read_text().rstrip() == block
    # every committed run of the experiment is one of its pre-registered (arm, seed) runs
    for name in run_names(exp):
        arm, seed = name.rsplit("__s", 1)
        assert arm in design.arms and int(seed) in design.seeds, name


def test_clip_v_amendment_judges_its_arms_within_its_commit(tmp_path):
    an = _load("scripts.studies.sod.analysis")
    ps = {"grpo": [0.30, 0.40], "clip_v": [0.31, 0.40], "clip_v_rescaled": [0.50, 0.62], "clip_b": [0.5, 0.6]}
    for arm, values in ps.items():
        for seed, p in enumerate(values):
            _fake_run(tmp_path, arm, seed, p)
    _fake_run(tmp_path, "clip_b", 2, 0.6)  # a seed the first arms lack: only clip_b's comparisons could use it
    summary = an.analyze(tmp_path, experiment="sod_clipv")
    pairs = [(c["treated"], c["control"], c["seeds"]) for c in summary["comparisons"]]
    assert pairs == [
        ("clip_v", "grpo", [0, 1]),
        ("clip_v_rescaled", "grpo", [0, 1]),
        ("clip_b", "grpo", [0, 1]),
        ("clip_v", "clip_b", [0, 1]),
        ("clip_v_rescaled", "clip_b", [0, 1]),
    ]
    block = (tmp_path / "readme_block.md").read_text()
    assert "--experiment sod_clipv --analyze" in block and "experiments/sod_clipv/runs.parquet" in block
    assert "Status: 9 of the 32 pre-registered runs have finished." in block
    # one comparison by hand: clip_v_rescaled - grpo avg@64 per seed is the mean over the two prompts
    d = [(0.50 - 0.30) * 0.75, (0.62 - 0.40) * 0.75]  # sum prompt p, diff prompt p / 2: mean of p and p / 2
    assert summary["comparisons"][1]["avg@64"]["mean"] == pytest.approx(sum(d) / 2)


def test_block_before_the_first_run(tmp_path):
    an = _load("scripts.studies.sod.analysis")
    (tmp_path / "per_run").mkdir()
    an.analyze(tmp_path, experiment="sod_clipv")
    assert (tmp_path / "readme_block.md").read_text() == "(no runs analysed yet)\n"


def test_analyze_writes_tables_and_block(tmp_path):
    an = _load("scripts.studies.sod.analysis")
    for arm, values in {"grpo": [0.3, 0.4], "clip_b": [0.5, 0.6], "replay_mask": [0.3, 0.45]}.items():
        for seed, p in enumerate(values):
            _fake_run(tmp_path, arm, seed, p)
    summary = an.analyze(tmp_path)
    assert [(c["treated"], c["control"]) for c in summary["comparisons"]] == [
        ("clip_b", "grpo"),
        ("replay_mask", "grpo"),
        ("clip_b", "replay_mask"),
    ]
    block = (tmp_path / "readme_block.md").read_text()
    assert "6 committed runs" in block and "code revision abc1234" in block and "| 0.827 |" in block
    assert "Status: 6 of the 40 pre-registered runs have finished." in block
    assert json.loads((tmp_path / "summary.json").read_text())["arm_means"]["clip_b"]["n"] == 2

"""scripts/studies/horizon/analysis.py: the pre-registered class-weighted endpoint, pooled and per-base verdicts on
hand-made runs; and the generated blocks of both experiments (horizon, short) match their committed runs."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from _scripts import load_script
from _study_runs import train_row, write_run

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
EXP = SCRIPTS / "forking" / "experiments" / "horizon"
#: p(correct) per class at steps 40-120, as a multiple of the run's p; step 0 has 0.5 everywhere.
SCALE = {"A": 1.0, "B": 0.5, "C": 0.25, "D": 0.1}


def _fake_run(exp: Path, base: str, arm: str, seed: int, p: float, rev: str = "abc1234") -> None:
    """Two prompts per class evaluated at steps 0, 40, 80, 120; p(first token right) = 0.8 after step 0."""
    rows = []
    for step in (0, 40, 80, 120):
        for cls in "ABCD":
            for i in range(2):
                q = 0.5 if step == 0 else p * SCALE[cls]
                first = 0.5 if step == 0 else 0.8
                rows.append(
                    {
                        "step": step,
                        "temperature": 1.0,
                        "prompt": f"{cls.lower()}{i}>",
                        "class": cls,
                        "logp": math.log(q),
                        "logp_first": math.log(first),
                    }
                )
    train = [train_row(s, (0.4, 2, 0.1, 64), (0.02, 1, 0.01, 1800)) for s in (1, 2, 3, 4)]
    shortfall = 4 if arm == "replay_mask" else None
    write_run(exp, f"{base}__{arm}__s{seed}", rows, train, rev, replay_shortfall=shortfall)


def test_class_weighted_endpoint_against_hand_computation(tmp_path):
    an = load_script("scripts.studies.horizon.analysis")
    _fake_run(tmp_path, "fork-s0", "grpo", 0, 0.6)
    run = an.load_runs(tmp_path)[("fork-s0", "grpo", 0)]
    e = an.endpoint(run["eval"])
    weights = {"A": 0.70, "B": 0.20, "C": 0.08, "D": 0.02}
    assert e["avg@64"] == pytest.approx(sum(w * 0.6 * SCALE[c] for c, w in weights.items()))
    assert e["pass@64"] == pytest.approx(sum(w * (1 - (1 - 0.6 * SCALE[c]) ** 64) for c, w in weights.items()))
    assert e["p_first_B"] == pytest.approx(0.8) and e["exec_given_first_B"] == pytest.approx(0.3 / 0.8)
    assert an.at_step([r for r in run["eval"] if r["step"] == "0"])["avg@64"] == pytest.approx(0.5)


def test_pooled_and_per_base_comparisons(tmp_path):
    an = load_script("scripts.studies.horizon.analysis")
    ps = {"grpo": [0.30, 0.40, 0.50], "clip_b": [0.40, 0.45, 0.62], "replay_mask": [0.30, 0.41, 0.49]}
    for base in ("fork-s0", "fork-s1"):
        for arm, values in ps.items():
            for seed, p in enumerate(values):
                _fake_run(tmp_path, base, arm, seed, p)
    _fake_run(tmp_path, "fork-s0", "clip_b", 3, 0.9)  # no grpo / replay partner: in no primary comparison
    table = an.per_run_table(an.load_runs(tmp_path))
    comps = an.comparisons(table, ["fork-s0", "fork-s1"])
    assert [(c["scope"], c["treated"], c["control"]) for c in comps][:3] == [
        ("pooled", "clip_b", "grpo"),
        ("pooled", "replay_mask", "grpo"),
        ("pooled", "clip_b", "replay_mask"),
    ]
    pooled = comps[0]
    assert len(pooled["units"]) == 6 and ["fork-s0", 3] not in pooled["units"]
    d = [table[f"{b}__clip_b__s{s}"]["avg@64"] - table[f"{b}__grpo__s{s}"]["avg@64"] for b, s in pooled["units"]]
    mean = sum(d) / 6
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / 5)
    half = 2.570581835636314 * sd / math.sqrt(6)  # t_{0.975, 5}
    assert pooled["avg@64"]["mean"] == pytest.approx(mean)
    assert pooled["avg@64"]["low"] == pytest.approx(mean - half) and pooled["avg@64"]["high"] == pytest.approx(
        mean + half
    )
    assert pooled["avg@64"]["p_sign_flip"] == pytest.approx(2 / 64)  # six positive: 2 of 64 patterns as extreme
    per_base = [c for c in comps if c["scope"] == "fork-s1"][0]
    assert len(per_base["units"]) == 3 and per_base["avg@64"]["p_sign_flip"] == pytest.approx(2 / 8)


def test_analysis_refuses_mixed_revisions(tmp_path):
    an = load_script("scripts.studies.analysis")  # every study's loader
    _fake_run(tmp_path, "fork-s0", "grpo", 0, 0.3, rev="aaaaaaa")
    _fake_run(tmp_path, "fork-s1", "grpo", 0, 0.3, rev="bbbbbbb")
    with pytest.raises(ValueError, match="code revision"):
        an.load_runs(tmp_path)


def test_analyze_writes_block_with_the_status(tmp_path):
    an = load_script("scripts.studies.horizon.analysis")
    for arm, values in {"grpo": [0.3, 0.4], "clip_b": [0.5, 0.6], "replay_mask": [0.3, 0.45]}.items():
        for seed, p in enumerate(values):
            _fake_run(tmp_path, "fork-s0", arm, seed, p)
    summary = an.analyze(tmp_path)
    block = (tmp_path / "readme_block.md").read_text()
    assert "6 committed runs" in block and "code revision abc1234" in block and "(steps 40, 80, 120)" in block
    assert "6 of the 30 pre-registered primary runs" in block and "2 of 10 (base, seed) units" in block
    assert "no comparison can be better/worse yet" in block
    assert "| fork-s0 | always A, executed right (floor) |" in block
    one = tmp_path / "one"  # one complete unit and a lone run: no comparison
    for arm in ("grpo", "clip_b", "replay_mask"):
        _fake_run(one, "fork-s1", arm, 0, 0.5)
    _fake_run(one, "fork-s0", "grpo", 0, 0.5)
    an.analyze(one)
    assert "1 of 10 (base, seed) units" in (one / "readme_block.md").read_text()
    share = summary["arm_means"]["fork-s0__replay_mask"]["replay_matched_share"]
    assert share == pytest.approx(12 / 16)  # 3 masked per step x 4 steps, 4 short
    assert (tmp_path / "pass_at_64.png").exists()
    docs = (tmp_path / "docs_block.md").read_text()
    assert "Clip_B mu 2.5 - GRPO** (n = 2 units)" in docs and "per-unit" not in docs.split("Per-base")[0].lower()


def test_block_of_an_experiment_without_runs(tmp_path):
    an = load_script("scripts.studies.horizon.analysis")
    summary = an.analyze(tmp_path, experiment="short")
    assert summary["n_runs"] == 0 and summary["comparisons"] == []
    for name in ("readme_block.md", "docs_block.md"):
        text = (tmp_path / name).read_text()
        assert "--experiment short --analyze" in text and "not started" in text and "|" not in text
    assert not (tmp_path / "pass_at_64.png").exists()


@pytest.mark.parametrize("experiment", ["horizon", "short"])
def test_readme_block_matches_the_committed_runs(tmp_path, experiment):
    an = load_script("scripts.studies.horizon.analysis")
    exp = EXP.parent / experiment
    if (exp / "runs.parquet").exists():
        shutil.copy(exp / "runs.parquet", tmp_path / "runs.parquet")
    an.analyze(tmp_path, experiment=experiment)
    option = "" if experiment == "horizon" else f" --experiment {experiment}"
    stale = f"stale: run python -m scripts.studies.horizon{option} --analyze --update-readme"
    assert an.DOCS[experiment], experiment
    for path, marker, kind in an.DOCS[experiment]:
        text = path.read_text()
        block = text.split(f"<!-- {marker}:begin -->\n", 1)[1].split(f"<!-- {marker}:end -->", 1)[0].rstrip()
        expected = (tmp_path / ("readme_block.md" if kind == "full" else "docs_block.md")).read_text().rstrip()
        assert block == expected, f"{path.name}: {stale}"


def test_status_reads_finished_runs_from_the_table(tmp_path, capsys):
    """A run folded into the experiment's table (its directory gone, as after a sync) is listed as done."""
    runner = load_script("scripts.studies.runner")
    results = load_script("scripts.studies.results")
    _fake_run(tmp_path / "table", "fork-s0", "grpo", 0, 0.3, rev="c0ffee1")
    _fake_run(tmp_path / "dir", "fork-s0", "clip_b", 0, 0.3, rev="c0ffee2")
    results.collect(tmp_path, source=tmp_path / "table" / "per_run")
    (tmp_path / "per_run").mkdir()
    shutil.move(tmp_path / "dir" / "per_run" / "fork-s0__clip_b__s0", tmp_path / "per_run")
    keys = [("fork-s0", "grpo", 0), ("fork-s0", "clip_b", 0), ("fork-s0", "replay_mask", 0)]
    args = SimpleNamespace(exp=tmp_path, experiment="horizon", steps=4, eval_every=40)
    study = runner.arm_study("t", "m", args, name=lambda key: "__".join([key[0], key[1], f"s{key[2]}"]), train=print)
    runner.status(study, keys)
    lines = capsys.readouterr().out.splitlines()
    assert "done" in lines[0] and "code c0ffee1" in lines[0]  # from the table
    assert "done" in lines[1] and "code c0ffee2" in lines[1]  # from per_run/
    assert lines[2].split() == ["fork-s0__replay_mask__s0", "todo"]
    assert study.ready(("fork-s0", "replay_mask", 0)) and not study.ready(("fork-s1", "replay_mask", 0))

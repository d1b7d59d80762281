"""Smoke run of scripts/forking_study.py: the whole pipeline (train, evaluate, collect, analyse) on a tiny grid."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load(name: str):
    if str(SCRIPTS) not in sys.path:
        sys.path.insert(0, str(SCRIPTS))
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def test_grid_and_bad_methods():
    study = _load("forking_study")
    args = study.parse_args(["--out", "x", "--grid", "priority"])
    runs = study.grid(args)
    assert len(runs) == len(study.PRIORITY_METHODS) * len(study.FORK_BASES) * len(study.SEEDS)
    full = study.grid(study.parse_args(["--out", "x", "--grid", "full"]))
    assert {r.method for r in full} == set(study.METHODS) and {r.task for r in full} == {"forking", "chain"}
    with pytest.raises(ValueError, match="--methods"):
        study.grid(study.parse_args(["--out", "x", "--methods", "grpo,nope"]))
    # every method overlay exists and every run's arguments name existing configs
    for run in full:
        configs = [a for a in study.cli_args(run, Path("r"), False) if a.endswith(".yaml")]
        assert all(Path(c).exists() for c in configs)


def test_paired_bootstrap_against_brute_force():
    np = pytest.importorskip("numpy")
    pytest.importorskip("pandas")
    analysis = _load("forking_analysis")
    rng = np.random.default_rng(0)
    diff = rng.normal(0.3, 0.1, size=(5, 12))
    classes = np.array(list("AAAAAABBBBCC"))
    weights = {"A": 0.5, "B": 0.3, "C": 0.2}
    point, lo, hi = analysis.paired_bootstrap(diff, classes, weights, draws=4000)
    by_hand = np.mean([0.5 * r[:6].mean() + 0.3 * r[6:10].mean() + 0.2 * r[10:].mean() for r in diff])
    assert point == pytest.approx(by_hand)
    assert lo < point < hi and hi - lo < 0.5
    # a constant difference has a degenerate interval
    assert analysis.paired_bootstrap(np.full((3, 12), 0.1), classes, weights, 100) == pytest.approx((0.1, 0.1, 0.1))


@pytest.mark.slow
def test_smoke_study_runs_and_resumes(tmp_path):
    pytest.importorskip("matplotlib")
    study = _load("forking_study")
    if not (study.MODELS_DIR / "fork-s0" / "model.safetensors").exists():
        pytest.fail(f"base models missing under {study.MODELS_DIR}: run python scripts/make_forking_models.py")
    study.main(["--smoke", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    methods = {(r["task"], r["method"]) for r in summary["phenomenon"]}
    assert {("forking", "grpo"), ("forking", "clip_b"), ("forking", "random_mask"), ("chain", "grpo")} <= methods
    assert {r["method"] for r in summary["paired_vs_grpo"]} == {"clip_b", "random_mask"}
    for png in ("entropy_and_masking.png", "pass_at_k_fork-s0.png", "paired_vs_grpo.png"):
        assert (tmp_path / png).stat().st_size > 0
    train = (tmp_path / "train.csv").read_text().splitlines()
    assert train[0].count("entropy_strategy") == 1 and len(train) == 1 + 4 * 2  # 4 runs x 2 steps
    # resumable: a second call finds every run done and trains nothing
    done = sorted(p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done"))
    study.main(["--smoke", "--out", str(tmp_path)])
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done")) == done

"""Experiment F's runner support (issue 39, ``experiments/sod_methods/PREREGISTRATION.md``): the design entry, the
rollout-batch horizon of the mini-batched arms, the per-batch "acts on" record and the analysis's three families."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from _scripts import load_script
from _study_runs import sod_eval_rows, train_row, write_run

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"
#: The pre-registration's table, in its order.
TABLE = tuple(
    "grpo clip_b clip_v_rescaled clip_cov kl_cov grpo_mb4 high_entropy adaptive_entropy stare entrocraft s2t "
    "advantage_reweighting unlikeliness repo_r".split()
)
METHODS = tuple(a for a in TABLE if a not in ("grpo", "grpo_mb4", "kl_cov"))


def test_design_is_the_preregistered_one():
    sod = load_script("scripts.studies.sod.run")
    design = sod.EXPERIMENTS["sod_methods"]
    assert tuple(design.arms) == TABLE and design.seeds == (0, 1, 2, 3, 4, 5)
    assert design.bases == {"sod-s0": "sod/model", "sod-s1": "sod_robust/models/sod-s1"}
    assert design.planned_runs == 168 and design.rule == "holm"
    for arm, overlay in design.arms.items():
        assert (sod.CONFIGS / overlay).exists(), arm
    assert design.arms["clip_v_rescaled"] == "clip_v_sod.yaml" and design.arms["clip_b"] == "clip_b.yaml"
    # primary: the eleven methods - GRPO, and KL-Cov against its own recipe's GRPO; secondary: each other - Clip_B
    assert design.comparisons == (*((a, "grpo") for a in METHODS), ("kl_cov", "grpo_mb4"))
    assert design.secondary == tuple((a, "clip_b") for a in (*METHODS[1:], "kl_cov"))
    assert len(design.comparisons) == 12 and len(design.secondary) == 11
    # unit by unit, seed-major then base, a unit's 14 arms consecutively in the table's order
    keys = sod.planned(tuple(design.arms), design.seeds, design)
    assert keys[:15] == [("sod-s0", a, 0) for a in TABLE] + [("sod-s1", "grpo", 0)]
    assert keys[14 * 2] == ("sod-s0", "grpo", 1) and len(keys) == 168
    assert [(b, s) for b, _, s in keys[::14]] == [(b, s) for s in range(6) for b in ("sod-s0", "sod-s1")]


def test_updates_per_rollout_batch_from_the_overlays():
    sod = load_script("scripts.studies.sod.run")
    design = sod.EXPERIMENTS["sod_methods"]
    # 16 prompts x 8 samples = 128 sequences; mini-batches of 32: 4 updates; every other arm one
    got = {arm: sod.updates_per_rollout_batch(overlay) for arm, overlay in design.arms.items()}
    assert got == {arm: 4 if arm in ("kl_cov", "grpo_mb4") else 1 for arm in TABLE}


class _Method:
    """A method callback as the library's count them: ``count_tokens(mask, acted_on)`` and ``last_metrics``."""

    def __init__(self) -> None:
        self.counted: list[int] = []
        self.last_metrics: dict[str, float] = {}
        self.coef = 0.25

    def count_tokens(self, mask: torch.Tensor, acted_on: torch.Tensor | None = None) -> None:
        self.counted.append(int(mask.sum()))

    def tag(self, name: str) -> str:
        return f"train/method/{name}"


def test_recorder_maps_optimizer_steps_to_rollout_batches_and_splits_the_acted_on_tokens():
    controls = load_script("scripts.studies.controls")
    calls = []
    recorder = controls.RoleRecorder(lambda batch, _: calls.append(batch), updates_per_batch=4, acted_on=True)
    method = _Method()
    trainer = SimpleNamespace(callbacks=[method, recorder], global_step=0, callback_metrics={})
    recorder.setup(trainer, None, "fit")
    recorder.on_train_start(trainer, None)
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    acted = torch.tensor([[True, False, True, True], [False, True, True, False]])  # padding never counts
    for batch in (1, 2):
        method.count_tokens(mask, acted)  # strategy: row 0; exec: (0, 2), (1, 1)
        method.last_metrics = {"train/method/frac": 0.1 * batch}
        trainer.global_step = 4 * batch
        recorder.observe_keep_mask(
            trainer,
            None,
            SimpleNamespace(mask=mask, advantages=torch.ones(2, 4), entropy=torch.zeros(2, 4)),
            mask,
        )
        recorder.on_train_batch_end(trainer, None, None, None, batch - 1)
    assert calls == [0, 1, 2] and method.counted == [5, 5]  # the library's own count still runs
    assert [(r["step"], r["optimizer_step"]) for r in recorder.rows] == [(1, 4), (2, 8)]
    assert [(r["acted_n_strategy"], r["acted_n_exec"]) for r in recorder.rows] == [(1, 2), (1, 2)]
    assert json.loads(recorder.rows[1]["method_metrics"]) == {"train/method/frac": 0.2, "train/method/coef": 0.25}
    with pytest.raises(ValueError, match="updates_per_batch must be >= 1, got 0"):
        controls.RoleRecorder(updates_per_batch=0)


def test_kl_cov_runs_four_updates_per_rollout_batch_and_evaluates_per_batch(tmp_path):
    sod = load_script("scripts.studies.sod.run")
    argv = ["--experiment", "sod_methods", "--exp", str(tmp_path), "--run", "--bases", "sod-s0"]
    sod.main([*argv, "--arms", "kl_cov", "--seeds", "0", "--steps", "2", "--eval-every", "1"])
    run = tmp_path / "per_run" / "sod-s0__kl_cov__s0"
    train = list(csv.DictReader((run / "train.csv").open()))
    assert [(r["step"], r["optimizer_step"]) for r in train] == [("1", "4"), ("2", "8")]
    assert sorted({int(r["step"]) for r in csv.DictReader((run / "eval.csv").open())}) == [0, 1, 2]
    done = json.loads((run / "done.json").read_text())
    assert done["steps"] == 2 and done["updates_per_batch"] == 4
    for r in train:  # 2 % of the batch's tokens penalised (at least one), split by role
        n = int(r["tokens_strategy"]) + int(r["tokens_exec"])
        assert int(r["acted_n_strategy"]) + int(r["acted_n_exec"]) == max(int(0.02 * n), 1)
        assert json.loads(r["method_metrics"])["train/kl_cov/frac"] == pytest.approx(max(int(0.02 * n), 1) / n)


def _fake_run(exp: Path, base: str, arm: str, seed: int, p: float, acted: int) -> None:
    """Two test prompts at steps 0, 40, 80, 120 with p(correct) = p at the last three; 60 rollout batches, the
    method acting on ``acted`` strategy tokens and 2 x ``acted`` execution tokens per batch over batches 1-50."""
    train = []
    for s in range(1, 61):
        row = train_row(s, (0.1, 0, 0.0, 128), (0.1, 0, 0.0, 1000))
        n = acted if s <= 50 else 0
        train.append({**row, "optimizer_step": s, "acted_n_strategy": n, "acted_n_exec": 2 * n, "method_metrics": "{}"})
    write_run(exp, f"{base}__{arm}__s{seed}", sod_eval_rows(p), train, seconds=120.0)


def test_analysis_families_on_hand_made_runs_and_on_no_run(tmp_path):
    design = load_script("scripts.studies.sod.design").EXPERIMENTS["sod_methods"]
    units_mod = load_script("scripts.studies.sod.units")
    empty = tmp_path / "empty"
    empty.mkdir()
    summary = units_mod.analyze_units(empty, design, "sod_methods")
    assert summary["families"] == [] and summary["finished_runs"] == 0
    for name in ("readme_block.md", "docs_block.md"):
        text = (empty / name).read_text()
        assert "PROVISIONAL: 0 of the 168 pre-registered runs" in text and "No verdict yet: n = 0 units." in text
    # 3 complete units; every method's p(correct) = GRPO's + 0.01 + 0.001 x its index, grpo_mb4 = GRPO + 0.005
    # (small p: pass@64 = 1 - (1 - p)^64 is far from 1, so every pass@64 difference is positive too)
    exp = tmp_path / "runs"
    for base, seed, grpo in (("sod-s0", 0, 0.010), ("sod-s0", 1, 0.015), ("sod-s1", 0, 0.005)):
        for i, arm in enumerate(TABLE):
            p = grpo if arm == "grpo" else grpo + 0.005 if arm == "grpo_mb4" else grpo + 0.01 + 0.001 * i
            _fake_run(exp, base, arm, seed, p, acted=i)
    summary = units_mod.analyze_units(exp, design, "sod_methods")
    fams = summary["families"]
    assert [(f["name"], f["metric"], f["kind"], f["m"], f["n"]) for f in fams] == [
        ("pooled", "pass@64", "primary", 12, 3),
        ("pooled", "avg@64", "secondary", 12, 3),
        ("pooled", "pass@64", "secondary", 11, 3),
    ]
    t = fams[1]["tests"][-1]  # kl_cov - grpo_mb4 on avg@64 = p: (g + 0.014) - (g + 0.005) in every unit
    assert (t["treated"], t["control"]) == ("kl_cov", "grpo_mb4") and t["mean"] == pytest.approx(0.009)
    # 3 positive units: p = 2/8 each; Holm over 12 caps at 1; Bonferroni level 1 - 0.05/12
    assert all(x["p_sign_flip"] == 0.25 and x["p_holm"] == 1.0 for f in fams for x in f["tests"])
    assert fams[0]["tests"][0]["level"] == pytest.approx(1 - 0.05 / 12)
    assert fams[2]["tests"][0]["level"] == pytest.approx(1 - 0.05 / 11)
    # kl_cov - clip_b on pass@64 = (1 - p_clip_b)^64 - (1 - p_kl_cov)^64 per unit (both prompts alike)
    hand = [(1 - g - 0.011) ** 64 - (1 - g - 0.014) ** 64 for g in (0.010, 0.015, 0.005)]
    assert fams[2]["tests"][-1]["control"] == "clip_b" and fams[2]["tests"][-1]["mean"] == pytest.approx(sum(hand) / 3)
    # descriptive: grpo_mb4 - grpo pooled, then the twelve per base (sod-s0 has 2 units; sod-s1 1: none)
    desc = summary["descriptive"]
    assert (desc[0]["treated"], desc[0]["control"], len(desc[0]["units"])) == ("grpo_mb4", "grpo", 3)
    assert len(desc) == 13 and {d.get("base") for d in desc[1:]} == {"sod-s0"}
    m = summary["arm_means"]["sod-s0__stare"]  # index 8: 8 strategy / 16 exec tokens per batch in batches 1-50
    assert m["acted_early_strategy"] == 8 and m["acted_per_step_strategy"] == pytest.approx(8 * 50 / 60)
    assert m["acted_share_exec"] == pytest.approx(16 / 1000 * 50 / 60)
    block = (exp / "readme_block.md").read_text()
    assert "PROVISIONAL: 42 of the 168 pre-registered runs have finished; 3 of the 12" in block
    assert "primary, pooled: **KL-Cov (ratio 0.02, 4 mini-batches) - GRPO, 4 mini-batches** pass@64 (n = 3)" in block
    assert "| sod-s0 | STARE | 2 | " in block and "| 6.7 / 13.3 | 8.0 / 16.0 |" in block
    assert "descriptive, sod-s0 (no verdict): STARE - GRPO" in block

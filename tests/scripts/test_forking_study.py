"""Smoke run of scripts/studies/forking/: the whole pipeline (train, evaluate, collect, analyse) on a tiny grid."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from _scripts import load_script

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


_load = load_script


def test_grid_and_bad_methods():
    study = _load("scripts.studies.forking.run")
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
    analysis = _load("scripts.studies.forking.analysis")
    rng = np.random.default_rng(0)
    diff = rng.normal(0.3, 0.1, size=(5, 12))
    classes = np.array(list("AAAAAABBBBCC"))
    weights = {"A": 0.5, "B": 0.3, "C": 0.2}
    point, lo, hi = analysis.paired_bootstrap(diff, classes, weights, draws=4000)
    by_hand = np.mean([0.5 * r[:6].mean() + 0.3 * r[6:10].mean() + 0.2 * r[10:].mean() for r in diff])
    assert point == pytest.approx(by_hand)
    assert lo < point < hi and hi - lo < 0.5
    # a constant difference has a degenerate interval
    constant = analysis.paired_bootstrap(np.full((3, 12), 0.1), classes, weights, 100)
    assert tuple(constant) == pytest.approx((0.1, 0.1, 0.1)) and constant.n == 3


def test_results_block_is_generated_from_the_committed_tables(tmp_path):
    """The committed ``results/readme_table.md`` equals what the analysis prints from the committed tables."""
    np = pytest.importorskip("numpy")
    pd = pytest.importorskip("pandas")
    analysis, study = _load("scripts.studies.forking.analysis"), _load("scripts.studies.forking.run")
    results = study.STUDY_DIR / "results"
    for name in ("eval.parquet", "train.parquet", "run_seconds.json"):
        shutil.copy(results / name, tmp_path / name)
    analysis.analyze(tmp_path, plots=False)
    block = (tmp_path / "readme_table.md").read_text()
    stale = "stale: python -m scripts.studies.forking --analyze --out scripts/forking/results"
    assert (results / "readme_table.md").read_text() == block, stale
    # One headline number by hand: GRPO on fork-s0, last step, T = 1, p(correct) weighted 70/20/8/2 % by class.
    ev = pd.read_parquet(results / "eval.parquet")
    g = ev[(ev["base"] == "fork-s0") & (ev["method"] == "grpo") & (ev["temperature"] == 1.0)]
    g = g[g["step"] == g["step"].max()]
    per_seed = [
        sum(w * np.exp(s[s["class"] == c]["logp"]).mean() for c, w in zip("ABCD", (0.7, 0.2, 0.08, 0.02), strict=True))
        for _, s in g.groupby("seed")
    ]
    assert f"| fork-s0 | GRPO | {len(per_seed)} | {np.mean(per_seed):.3f} |" in block
    assert analysis.PAPER_ROW in block and "16.88 -> 19.69" in block


def test_verdicts_and_block_replacement(tmp_path):
    analysis = _load("scripts.studies.forking.analysis")
    row = dict(task="forking", base="b", method="clip_b", endpoint="last", metric="pass@64", diff=0.1)
    paired = [dict(row, lo=0.05, hi=0.2), dict(row, metric="avg@64", lo=-0.1, hi=0.2)]
    assert analysis._verdict(paired, "forking", "b", "clip_b")[0] == "better"
    assert analysis._verdict([dict(row, lo=-0.3, hi=-0.01)], "forking", "b", "clip_b")[0] == "worse"
    assert analysis._verdict(paired + [dict(row, lo=-0.3, hi=-0.01)], "forking", "b", "clip_b")[0] == "mixed"
    assert analysis._verdict(paired[1:], "forking", "b", "clip_b") == ("no difference", [])
    assert analysis._verdict(paired, "chain", "b", "clip_b") == ("not run", [])
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- x:start -->\nold\n<!-- x:end -->\ntail\n")
    assert analysis.replace_block(doc, "x", "new\n") and not analysis.replace_block(doc, "x", "new\n")
    assert doc.read_text() == "intro\n<!-- x:start -->\nnew\n<!-- x:end -->\ntail\n"
    with pytest.raises(ValueError, match="y:start"):
        analysis.replace_block(doc, "y", "z")


@pytest.mark.slow
def test_smoke_study_runs_and_resumes(tmp_path):
    pytest.importorskip("matplotlib")
    study = _load("scripts.studies.forking.run")
    if not (study.MODELS_DIR / "fork-s0" / "model.safetensors").exists():
        pytest.fail(f"base models missing under {study.MODELS_DIR}: run python -m scripts.studies.forking.make_models")
    study.main(["--smoke", "--out", str(tmp_path)])
    summary = json.loads((tmp_path / "summary.json").read_text())
    methods = {(r["task"], r["method"]) for r in summary["phenomenon"]}
    assert {("forking", "grpo"), ("forking", "clip_b"), ("forking", "random_mask"), ("chain", "grpo")} <= methods
    assert {r["method"] for r in summary["paired_vs_grpo"]} == {"clip_b", "random_mask"}
    block = (tmp_path / "readme_table.md").read_text()
    assert "| fork-s0 | Clip_B mu 2.5 | 1 |" in block and "Clip_B beats GRPO" in block
    assert "- Not in the tables yet" in block  # the smoke grid is a sliver of the design
    for png in (
        "entropy_and_masking.png",
        "pass_at_k_fork-s0.png",
        "pass_at_k_neutral_fork-s0.png",
        "paired_vs_grpo.png",
    ):
        assert (tmp_path / png).stat().st_size > 0
    train = pytest.importorskip("pandas").read_parquet(tmp_path / "train.parquet")
    assert "entropy_strategy" in train.columns and len(train) == 4 * 2  # 4 runs x 2 steps
    # resumable: a second call finds every run done and trains nothing
    done = sorted(p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done"))
    study.main(["--smoke", "--out", str(tmp_path)])
    assert sorted(p.stat().st_mtime_ns for p in (tmp_path / "runs").glob("*/done")) == done


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_exact_correct_probability_matches_sampling(temperature):
    """Teacher-forced p(correct response) against the share of correct samples (independent Monte-Carlo reference)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scripts.studies.tasks.forking import reward

    study = _load("scripts.studies.forking.run")
    path = study.MODELS_DIR / "fork-s0"
    if not (path / "model.safetensors").exists():
        pytest.fail(f"base model missing: {path}; run python -m scripts.studies.forking.make_models")
    torch.manual_seed(0)
    policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.padding_side = "left"
    rows = [r for r in study.load_rows("forking", "test") if r["class"] in "AB"][:2]
    logp, _ = study.correct_logprob(policy, tokenizer, rows, temperature)
    n = 400
    for row, lp in zip(rows, logp, strict=True):
        enc = tokenizer([row["prompt"]] * n, return_tensors="pt", add_special_tokens=False)
        out = policy.generate(
            **enc,
            do_sample=True,
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            max_new_tokens=31,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
        share = sum(reward(texts, [row["answer"]] * n)) / n
        p = float(torch.tensor(lp).exp())
        assert abs(share - p) < 4 * (p * (1 - p) / n) ** 0.5 + 1e-3, (row["prompt"], share, p)


def test_every_method_config_instantiates(tmp_path, monkeypatch):
    """base.yaml + each overlay (+ neutral.yaml) parses into the intended module and callbacks (no weights loaded)."""
    from lit_entropy.callbacks import AdaptiveEntropyBonus, EntropyDiscriminatorClipping, RandomNegativeMasking
    from lit_entropy.cli import cli_main

    monkeypatch.chdir(tmp_path)
    study = _load("scripts.studies.forking.run")
    for method in study.METHODS:
        for task, base in (("forking", "fork-s0"), ("chain", "chain")):
            run = study.Run(task, base, method, 3, 7)
            cli = cli_main(study.cli_args(run, tmp_path / run.name, False), run=False)
            st = cli.model.settings
            assert cli.trainer.max_steps == 7 and cli.datamodule.seed == 3 and cli.model.policy is None
            assert st.reward.fn == "scripts.studies.tasks.forking:reward" and st.loss.kl_coef == 0
            assert st.sampling.temperature == 1.0 and st.sampling.num_samples == 8 and st.update.epochs == 1
            from scripts.studies.tasks.forking import CHAIN_DIGITS, chain_sum_response

            # The response, <eos>, one token of slack.
            chain_len = len(chain_sum_response("1" * CHAIN_DIGITS)) + 2
            assert st.sampling.max_new_tokens == (31 if task == "forking" else chain_len)
            assert st.policy.model_name_or_path == str(study.MODELS_DIR / base)
            assert cli.datamodule.train_dataset.endswith(f"{task}/train.jsonl")
            masks = [cb for cb in cli.trainer.callbacks if isinstance(cb, EntropyDiscriminatorClipping)]
            randoms = [cb for cb in cli.trainer.callbacks if isinstance(cb, RandomNegativeMasking)]
            expected = {
                "clip_b": [("clip_b", 2.5, None)],
                "clip_v": [("clip_v", 8.5, 1e-4)],
                "clip_v_rescaled": [("clip_v", 8.5, 0.025)],
            }.get(method, [])
            got = [(cb.method, cb.mu, cb.max_frac if cb.method == "clip_v" else None) for cb in masks]
            assert got == expected
            assert [cb.mu for cb in randoms] == ([2.5] if method == "random_mask" else [])
            assert st.loss.clip_ratio_high == (0.28 if method == "clip_higher" else 0.2)
            # The entropy bonus starts at 0 and is tuned online towards Clip_B's mean entropy (target 0.02).
            bonus = [cb.entropy_target for cb in cli.trainer.callbacks if isinstance(cb, AdaptiveEntropyBonus)]
            assert bonus == ([0.02] if method == "entropy_bonus" else []) and st.loss.entropy_coef == 0

"""scripts/bench/step.py: the interleaving baton, the summary arithmetic, and a tiny end-to-end run (no TRL)."""

from __future__ import annotations

import json
import math
import statistics
import threading

import pytest


@pytest.fixture(scope="module")
def bench():
    from scripts.bench import step  # the repository root is on pytest's pythonpath

    return step


def _run_fake(bench, steps: dict[str, int], fail_at: tuple[str, int] | None = None):
    """Threads that take the baton once per step, recording (name, step) in the order they got it."""
    baton = bench.Baton(list(steps))
    order: list[tuple[str, int]] = []
    errors: dict[str, BaseException] = {}

    def work(name: str) -> None:
        baton.start(name)
        try:
            for i in range(steps[name]):
                baton.take(name)
                order.append((name, i))
                if fail_at == (name, i):
                    raise ValueError("boom")
        except BaseException as err:  # noqa: BLE001
            errors[name] = err
            baton.leave(name, err)
        else:
            baton.leave(name)

    threads = [threading.Thread(target=work, args=(n,), daemon=True) for n in steps]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    assert not any(t.is_alive() for t in threads), "baton deadlocked"
    return order, errors


def test_baton_rotates_and_drops_finished_runs(bench):
    order, errors = _run_fake(bench, {"a": 3, "b": 2, "c": 3})
    assert not errors
    # Worked out by hand: cycle 0 = a b c, cycle 1 starts one later = b c a, then b has finished and
    # cycle 2 over [a, c] starts at index 2 % 2 = 0 = a c.
    assert order == [("a", 0), ("b", 0), ("c", 0), ("b", 1), ("c", 1), ("a", 1), ("a", 2), ("c", 2)]


def test_baton_failure_stops_the_other_runs(bench):
    order, errors = _run_fake(bench, {"a": 5, "b": 5}, fail_at=("b", 0))
    assert isinstance(errors["b"], ValueError)
    assert isinstance(errors["a"], RuntimeError) and "another run failed" in str(errors["a"])
    assert order == [("a", 0), ("b", 0)]


def test_summarize_against_hand_computed_figures(bench):
    runs = {
        "grpo": bench.RunTimes("grpo", [1.0, 2.0, 3.0, 4.0], [10, 10, 10, 10]),
        "clip_v": bench.RunTimes("clip_v", [2.0, 3.0, 3.0, 5.0], [10, 20, 10, 10]),
        "trl": bench.RunTimes("trl", [1.0, 1.0, 1.0, 1.0], [5, 5, 5, 5]),
    }
    out = bench.summarize(runs)
    g, v, t = out["grpo"], out["clip_v"], out["trl"]
    # Medians 2.5, 3.0, 1.0; inclusive quartiles of 1,2,3,4 sit at positions 0.75 and 2.25.
    assert (g["s_per_step_q1"], g["s_per_step_median"], g["s_per_step_q3"]) == pytest.approx((1.75, 2.5, 3.25))
    # Throughputs use the median step time and the mean tokens per step (12.5 for clip_v).
    assert g["tokens_per_step"] == pytest.approx(10.0)
    assert g["tokens_per_s"] == pytest.approx(10 / 2.5)
    assert v["ms_per_token"] == pytest.approx(1e3 * 3.0 / 12.5)
    assert v["step_vs_grpo"] == pytest.approx(3.0 / 2.5)
    assert v["token_vs_grpo"] == pytest.approx((3.0 / 12.5) / (2.5 / 10))
    # Paired: per-step ratios 2/1, 3/2, 3/3, 5/4 -> median of (1.0, 1.25, 1.5, 2.0) = 1.375.
    assert v["paired_vs_grpo"] == pytest.approx(1.375)
    # Paired overhead: per-step ratios - 1 = (1.0, 0.5, 0.0, 0.25), mean 0.4375, sd 0.4270, t(0.975, 3) = 3.1824.
    o = v["overhead_vs_grpo"]
    half = 3.18245 * statistics.stdev([1.0, 0.5, 0.0, 0.25]) / 2
    assert o["mean"] == pytest.approx(0.4375) and o["ci_high"] == pytest.approx(0.4375 + half, rel=1e-4)
    assert "| clip_v | grpo | +43.8% [" in bench.format_table(out)
    assert g["step_vs_trl"] == pytest.approx(2.5 / 1.0)
    assert g["token_vs_trl"] == pytest.approx((2.5 / 10) / (1.0 / 5))
    assert "step_vs_grpo" not in t and "step_vs_grpo" not in g
    with pytest.raises(ValueError, match="no_steps"):
        bench.summarize({"no_steps": bench.RunTimes("no_steps")})


def test_bad_arguments_name_the_flag(bench):
    with pytest.raises(ValueError, match="--steps must be >= 1, got 0"):
        bench.main(["--steps", "0", "--skip-trl"])
    with pytest.raises(ValueError, match="--group-size must be >= 1, got -2"):
        bench.main(["--group-size", "-2", "--skip-trl"])


def test_tiny_lit_entropy_run_prints_the_table(bench, tmp_path, capsys):
    out_json = tmp_path / "bench.json"
    args = ["--steps", "2", "--warmup", "1", "--skip-trl", "--threads", "1", "--batch-size", "2"]
    args += ["--group-size", "2", "--max-new-tokens", "3", "--json", str(out_json)]
    summary = bench.main(args)
    printed = capsys.readouterr().out
    assert "| variant | steps | s/step median [IQR]" in printed
    for name in ("grpo", "clip_b", "clip_v"):
        assert f"\n| {name} | 2 | " in printed
    saved = json.loads(out_json.read_text())
    assert saved["settings"]["group_size"] == 2 and saved["settings"]["max_new_tokens"] == 3
    rows = 2 * 2
    for name in ("grpo", "clip_b", "clip_v"):
        run = saved["runs"][name]
        assert len(run["seconds"]) == 2 and all(s > 0 for s in run["seconds"])
        assert run["rollouts"] == [rows] * 3  # one rollout of batch x group completions per step, warm-up included
        # Every completion holds 1..max_new_tokens tokens (EOS included).
        assert all(rows * 1 <= tok <= rows * 3 for tok in run["tokens"])
        median = sorted(run["seconds"])[0] / 2 + sorted(run["seconds"])[1] / 2
        assert summary[name]["s_per_step_median"] == pytest.approx(median)
    g = sorted(saved["runs"]["grpo"]["seconds"])
    v = sorted(saved["runs"]["clip_v"]["seconds"])
    assert summary["clip_v"]["step_vs_grpo"] == pytest.approx((v[0] + v[1]) / (g[0] + g[1]))
    assert "trl" not in summary


def test_hashed_coin_reward_is_a_deterministic_crc_coin(bench):
    import zlib

    completions, answers = ["12", "<f9><f10>", "", "7"], ["3", "4", "5", "7"]
    expected = [float(zlib.crc32(f"{c}\x00{a}".encode()) % 2) for c, a in zip(completions, answers, strict=True)]
    assert bench.hashed_coin_reward(completions, answers) == expected
    many = bench.hashed_coin_reward([str(i) for i in range(200)], ["0"] * 200)
    assert 60 < sum(many) < 140  # both outcomes occur: groups get non-zero advantages


def test_realistic_summary_against_hand_computed_figures(bench):
    def side(seconds, cpu, rss, phases=()):
        return {
            "run": {"seconds": seconds, "cpu_seconds": cpu, "tokens": [10] * len(seconds), "phases": list(phases)},
            "peak_rss_mib": rss,
        }

    ph = {"generate": [1.0, 0.25], "statistics_pass": [0.5, 0.5], "update": [0.25, 0.125]}
    ph_v = {"generate": [1.0, 0.25], "statistics_pass": [0.25, 0.25], "update": [0.5, 0.25]}
    rounds = [
        {
            "grpo": side([2.0, 2.0], [1.0, 1.0], 100, [ph, ph]),
            "clip_v": side([2.2, 2.2], [1.1, 1.1], 110, [ph_v, ph_v]),
            "trl": side([4.0, 4.0], [4.0, 4.0], 200),
        },
        {
            "grpo": side([2.0, 2.0], [1.0, 1.0], 120, [ph, ph]),
            "clip_v": side([2.4, 2.4], [1.0, 1.0], 100, [ph_v, ph_v]),
            "trl": side([5.0, 5.0], [4.0, 4.0], 150),
        },
    ]
    out = bench.summarize_realistic(rounds)
    g = out["sides"]["grpo"]
    assert g["s_per_step"] == 2.0 and g["peak_rss_mib"] == 120 and g["tokens_per_s"] == pytest.approx(5.0)
    assert g["step_vs_trl"] == pytest.approx(2.0 / 4.5) and g["rss_vs_trl"] == pytest.approx(120 / 200)
    # other = median step - named phases: wall 2 - 1 - 0.5 - 0.25, CPU 1 - 0.25 - 0.5 - 0.125.
    assert g["phases"]["wall"]["other"] == pytest.approx(0.25) and g["phases"]["cpu"]["other"] == pytest.approx(0.125)
    v = out["overheads"]["clip_v"]["wall"]
    assert v["rounds"] == pytest.approx([0.1, 0.2])
    # t interval, 1 degree of freedom: mean 0.15 +- 12.706 * std(0.1, 0.2)/sqrt(2) = 0.15 +- 12.706 * 0.05.
    assert v["mean"] == pytest.approx(0.15) and v["ci_high"] == pytest.approx(0.15 + 12.7062 * 0.05, rel=1e-4)
    assert out["overheads"]["clip_v"]["cpu"]["rounds"] == pytest.approx([0.1, 0.0])
    # statistics pass + update: grpo wall 0.5 + 0.25, CPU 0.5 + 0.125; clip_v wall 0.25 + 0.5, CPU 0.25 + 0.25
    assert g["stats_update"] == pytest.approx({"wall": 0.75, "cpu": 0.625})
    assert out["sides"]["clip_v"]["stats_update_vs_grpo"] == pytest.approx({"wall": 1.0, "cpu": 0.8})
    assert "trl" in out["sides"] and "stats_update" not in out["sides"]["trl"]
    table = bench.format_realistic(out)
    assert "| clip_v | wall | +10.0% / +20.0% |" in table and "| clip_v | 0.75 | 0.50 | 1.00x | 0.80x |" in table


def test_realistic_model_shape_and_parameter_count(bench, tmp_path):
    out = bench.build_realistic_model(
        tmp_path / "m", vocab_size=300, hidden_size=128, num_layers=2, intermediate_size=200, num_kv_heads=1
    )
    # By hand: tied embedding; per layer q (128x128 + bias), k and v (64x128 + bias: one kv head of 64), o (128x128),
    # gate/up/down (3 x 128x200), two RMSNorms; the final RMSNorm.
    layer = (128 * 128 + 128) + 2 * (64 * 128 + 64) + 128 * 128 + 3 * 128 * 200 + 2 * 128
    count = 300 * 128 + 2 * layer + 128
    assert bench.model_shape(out) == (
        "vocab 300, hidden 128, 2 layers, intermediate 200, 2 heads / 1 kv heads, head_dim 64, tied head; "
        f"{count:,} parameters ({count * 4 / 2**20:.0f} MiB fp32)"
    )
    with pytest.raises(ValueError, match="--num-kv-heads must divide the 2 attention heads, got 3"):
        bench.build_realistic_model(tmp_path / "bad", vocab_size=300, hidden_size=128, num_kv_heads=3)


@pytest.mark.slow
def test_realistic_flag_runs_every_lit_side_in_its_own_process(bench, tmp_path, capsys):
    out_json = tmp_path / "realistic.json"
    args = ["--realistic", "--vocab-size", "300", "--hidden-size", "64", "--rounds", "2", "--warmup", "1"]
    args += ["--steps", "1", "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "3", "--threads", "1"]
    args += ["--sides", "grpo", "clip_v", "grpo_full_logits", "grpo_separate", "--json", str(out_json)]
    summary = bench.main(args)
    printed = capsys.readouterr().out
    assert "realistic shape: vocab 300, hidden 64" in printed
    saved = json.loads(out_json.read_text())
    assert [list(r) for r in saved["rounds"]] == [["grpo", "clip_v", "grpo_full_logits", "grpo_separate"]] * 2
    for r in saved["rounds"]:
        for result in r.values():
            run = result["run"]
            assert run["rollouts"] == [4, 4] and len(run["seconds"]) == 1 and result["peak_rss_mib"] > 50
            assert set(run["phases"][0]) >= {"generate", "statistics_pass", "update"}
            assert all(1 <= t <= 12 for t in run["tokens"])
    assert set(summary["overheads"]) == {"clip_v", "grpo_full_logits", "grpo_separate"}
    assert len(summary["overheads"]["clip_v"]["wall"]["rounds"]) == 2


@pytest.mark.slow
def test_realistic_interleaved_reports_paired_overheads(bench, capsys):
    args = ["--realistic", "--interleaved", "--vocab-size", "300", "--hidden-size", "64", "--warmup", "1"]
    args += ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "3", "--threads", "1"]
    summary = bench.main(args + ["--variants", "grpo", "clip_v"])
    assert set(summary) == {"grpo", "clip_v"}  # TRL is never part of this mode
    o = summary["clip_v"]["overhead_vs_grpo"]
    assert o["ci_low"] <= o["mean"] <= o["ci_high"]
    assert "| clip_v | grpo | " in capsys.readouterr().out


def test_summarize_runs_against_hand_computed_figures(bench):
    def run(clip_v: float, clip_b: float) -> dict:
        return {
            "grpo": {"steps": 3},
            "clip_v": {"overhead_vs_grpo": {"mean": clip_v, "ci_low": 0.0, "ci_high": 0.0}},
            "clip_b": {"overhead_vs_grpo": {"mean": clip_b, "ci_low": 0.0, "ci_high": 0.0}},
        }

    across = bench.summarize_runs([run(0.01, -0.02), run(0.03, 0.0), run(0.05, 0.02)])
    assert set(across) == {"clip_v", "clip_b"}
    # mean 0.03, sample sd 0.02, t(0.975, 2) = 4.302653 (t table): half width 4.302653 * 0.02 / sqrt(3)
    half = 4.302653 * 0.02 / 3**0.5
    assert across["clip_v"]["runs"] == [0.01, 0.03, 0.05]
    assert across["clip_v"]["mean"] == pytest.approx(0.03)
    assert across["clip_v"]["ci_low"] == pytest.approx(0.03 - half, rel=1e-5)
    assert across["clip_b"]["ci_high"] == pytest.approx(0.0 + half, rel=1e-5)
    # one run has no across-run interval: NaN bounds (scripts.studies.statistics' convention)
    single = bench.summarize_runs([run(0.01, 0.0)])["clip_v"]
    assert single["mean"] == 0.01 and math.isnan(single["ci_low"]) and math.isnan(single["ci_high"])


@pytest.mark.slow
def test_realistic_interleaved_runs_repeat_in_fresh_processes(bench, capsys):
    args = ["--realistic", "--interleaved", "--vocab-size", "300", "--hidden-size", "64", "--warmup", "1"]
    args += ["--steps", "2", "--batch-size", "2", "--group-size", "2", "--max-new-tokens", "3", "--threads", "1"]
    across = bench.main(args + ["--variants", "grpo", "clip_b", "--runs", "2"])
    assert set(across) == {"clip_b"} and len(across["clip_b"]["runs"]) == 2
    out = capsys.readouterr().out
    assert "run 2/2:" in out and "| clip_b | " in out and "95% t CI over runs" in out

"""scripts.studies.results: finished runs fold into one parquet table and come back as the CSV reader gave them."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from scripts.studies.results import collect, is_finished, load_runs, read_run_dir, run_rows, unfold


def _run(exp, name, logp, revision="abc1234", done=True):
    d = exp / "per_run" / name
    d.mkdir(parents=True)
    (d / "eval.csv").write_text(f'step,prompt,class,logp\n0,a1?,sum,-0.5\n40,"b,2?",diff,{logp}\n')
    (d / "train.csv").write_text("step,entropy,masked_n\n1,0.25,3\n2,1e-05,0\n")
    if done:
        (d / "done.json").write_text(json.dumps({"seconds": 1.5, "code_revision": revision, "replay_shortfall": None}))


def test_runs_round_trip_through_one_typed_table(tmp_path):
    _run(tmp_path, "grpo__s0", "-1.23457e-07")
    _run(tmp_path, "clip_b__s0", "-2")
    _run(tmp_path, "grpo__s1", "-3", done=False)  # unfinished: left out
    assert collect(tmp_path) == ["clip_b__s0", "grpo__s0"]
    table = pq.read_table(tmp_path / "runs.parquet")
    assert table.column_names == ["run", "code_revision", "record", "step", "prompt", "class", "logp", "entropy",
                                  "masked_n", "done"]  # fmt: skip
    assert str(table.schema.field("step").type) == "int64" and str(table.schema.field("logp").type) == "double"
    assert set(table.column("code_revision").to_pylist()) == {"abc1234"} and table.num_rows == 8
    runs = load_runs(tmp_path)
    assert list(runs) == ["clip_b__s0", "grpo__s0"]
    grpo = runs["grpo__s0"]
    assert grpo["done"] == {"seconds": 1.5, "code_revision": "abc1234", "replay_shortfall": None}
    assert grpo["eval"][1] == {"step": "40", "prompt": "b,2?", "class": "diff", "logp": "-1.23457e-07"}
    assert [float(r["entropy"]) for r in grpo["train"]] == [0.25, 1e-05]
    assert [int(r["masked_n"]) for r in grpo["train"]] == [3, 0]
    assert float(runs["clip_b__s0"]["eval"][1]["logp"]) == -2.0
    assert collect(tmp_path) == []  # idempotent
    for d in (tmp_path / "per_run").iterdir():  # the table alone carries the finished runs
        for f in d.iterdir():
            f.unlink()
        d.rmdir()
    assert is_finished(tmp_path, "grpo__s0") and not is_finished(tmp_path, "grpo__s1")
    assert run_rows(tmp_path, "grpo__s0", "train")[0] == {"step": "1", "entropy": "0.25", "masked_n": "3"}


def test_runs_with_other_columns_are_refused(tmp_path):
    _run(tmp_path, "grpo__s0", "-1")
    collect(tmp_path)
    d = tmp_path / "per_run" / "grpo__s1"
    d.mkdir(parents=True)
    (d / "eval.csv").write_text("step,prompt,class,logp_other\n0,a,sum,-1\n")
    (d / "train.csv").write_text("step,entropy,masked_n\n1,0.25,3\n")
    (d / "done.json").write_text(json.dumps({"code_revision": "x"}))
    with pytest.raises(ValueError, match="eval.csv columns differ between runs"):
        collect(tmp_path)


def test_unfold_gives_back_the_run_directories(tmp_path):
    exp = tmp_path / "exp"
    _run(exp, "grpo__s0", "-1.23457e-07")
    _run(exp, "clip_b__s0", "-2")
    originals = {n: read_run_dir(exp / "per_run" / n) for n in ("grpo__s0", "clip_b__s0")}
    texts = {n: (exp / "per_run" / n / "eval.csv").read_text() for n in originals}
    collect(exp)
    dest = tmp_path / "pinned" / "per_run"
    (dest / "clip_b__s0").mkdir(parents=True)
    (dest / "clip_b__s0" / "done.json").write_text("{}")  # already there: left alone
    assert unfold(exp, dest) == ["grpo__s0"]
    back = read_run_dir(dest / "grpo__s0")
    assert back == originals["grpo__s0"]  # rows, headers and done.json as they were written
    assert (dest / "grpo__s0" / "eval.csv").read_text().replace("\r\n", "\n") == texts["grpo__s0"]
    assert (dest / "clip_b__s0" / "done.json").read_text() == "{}" and unfold(exp, dest) == []
    assert collect(exp, dest) == []  # folding the pinned directory back adds nothing twice

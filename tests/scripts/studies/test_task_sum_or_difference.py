"""Sum-or-difference forking task: rule, correct-response sets, reward and splits, checked by brute force."""

from __future__ import annotations

import pytest

from scripts.studies.tasks.sum_or_difference import (
    SOD_SPLITS,
    always_sum_share,
    correct_responses,
    make_sod_examples,
    parse_prompt,
    reward,
    rule_strategy,
)


def _brute_correct(a: int, b: int) -> set[str]:
    """Every canonical response ("L" sum, "R" difference) whose result is the rule's answer, re-derived."""
    answer = a - b if a % 10 in (0, 5) else a + b
    out = set()
    if a + b == answer:
        out.add(f"L{a}+{b}={a + b}")
    if a - b == answer:
        out.add(f"R{a}-{b}={a - b}")
    return out


def test_correct_responses_match_brute_force_on_every_problem():
    for a in range(100):
        for b in range(10):
            assert set(correct_responses(a, b)) == _brute_correct(a, b)
            assert len(correct_responses(a, b)) == (2 if b == 0 else 1)
    assert rule_strategy(35) == "R" and rule_strategy(36) == "L" and rule_strategy(0) == "R"


def test_splits_partition_the_problems_and_keep_their_size():
    seen: dict[str, set[str]] = {}
    for split, size in SOD_SPLITS.items():
        rows = make_sod_examples(split, seed=3)
        assert len(rows) == size
        seen[split] = {r["prompt"] for r in rows}
        assert len(seen[split]) == size
        # another seed reorders, never changes the split's problems
        assert {r["prompt"] for r in make_sod_examples(split, seed=9)} == seen[split]
    assert not (seen["train"] & seen["test"]) and not (seen["train"] & seen["validation"])
    assert len(seen["train"] | seen["validation"] | seen["test"]) == 1000


def test_rows_answers_and_classes():
    for row in make_sod_examples("test"):
        a, b = parse_prompt(row["prompt"])
        assert set(row["answer"].split("|")) == _brute_correct(a, b)
        assert row["class"] == ("diff" if a % 5 == 0 else "sum")
    sft = make_sod_examples("train", seed=1, prior_l=0.75, n=4000)
    share_l = sum(r["answer"].startswith("L") for r in sft) / len(sft)
    assert abs(share_l - 0.75) < 0.03  # drawn whatever the rule: ~0.75 on both classes
    diff_rows = [r for r in sft if r["class"] == "diff"]
    assert abs(sum(r["answer"].startswith("L") for r in diff_rows) / len(diff_rows) - 0.75) < 0.06


def test_reward_and_floor():
    assert reward(["R20-3=17", "L20+3=23", " R20-3=17 ", "R20-3=18"], ["R20-3=17"] * 4) == [1.0, 0.0, 1.0, 0.0]
    assert reward(["L20+0=20", "R20-0=20"], ["L20+0=20|R20-0=20"] * 2) == [1.0, 1.0]
    with pytest.raises(ValueError, match="equal lengths"):
        reward(["a"], [])
    rows = make_sod_examples("test")
    expected = sum(r["class"] == "sum" or parse_prompt(r["prompt"])[1] == 0 for r in rows) / len(rows)
    assert always_sum_share("test") == pytest.approx(expected)
    with pytest.raises(ValueError, match="a,b"):
        parse_prompt("57+8")

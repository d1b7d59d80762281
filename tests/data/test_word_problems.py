"""The embedded word-problem task and its reward: answers re-derived by an independent reading of the text,
disjoint seeded splits, and the final-number extraction on the ways people write numbers."""

from __future__ import annotations

import re

import pytest

from lit_entropy.data.word_problems import (
    ANSWER_INSTRUCTION,
    EASY_INSTRUCTION,
    SPLITS,
    WORD_PROBLEM_TASKS,
    make_word_problems,
    split_of,
)
from lit_entropy.rewards import REWARD_FUNCTIONS, final_number, word_problem_reward

# Each sentence pattern and what it does to the running value, read from the text alone.
_RULES = (
    (r"^(?:\w+ has|\w+ starts the day with|There are|\w+ collected) (\d+) \w", lambda v, n: n),
    (r"(?:gives \w+|buys|finds) (\d+) more (?!packs? with)", lambda v, n: v + n),
    (r"(?:gives|loses|borrows) (\d+) (?!more)", lambda v, n: v - n),
    (r"buys (\d+) more packs? with as many", lambda v, n: v * (n + 1)),
    (r"has (\d+) times as many", lambda v, n: v * n),
    (r"equally into (\d+) boxes", lambda v, n: v // n),
    (r"equally with (\d+) friends?", lambda v, n: v // (n + 1)),
    (r"sells each [\w ]+ for (\d+) (?:dollars|cents)", lambda v, n: v * n),
)


def _solve(text: str) -> tuple[int, int]:
    """(answer, operations) by applying the sentence rules in order; every sentence must match exactly one."""
    value, operations = None, 0
    sentences = [s for s in re.split(r"(?<=[.?])\s+", text.split("\n")[0]) if not s.endswith("?")]
    for sentence in sentences:
        hits = [(rule, int(m.group(1))) for pattern, rule in _RULES if (m := re.search(pattern, sentence))]
        assert len(hits) == 1, (sentence, hits)
        rule, n = hits[0]
        if value is not None:
            operations += 1
            if "equally" in sentence:
                divisor = n if "boxes" in sentence else n + 1
                assert value % divisor == 0, sentence  # shares are exact
        value = rule(value, n)
        assert value >= 0
    return value, operations


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_answers_match_an_independent_reading_of_the_text(split):
    rows = make_word_problems(split, 300, seed=3)
    assert {row["operations"] for row in rows} == {1, 2, 3}
    for row in rows:
        assert row["prompt"].endswith("\n" + ANSWER_INSTRUCTION)
        assert _solve(row["prompt"]) == (int(row["answer"]), row["operations"])


def test_splits_are_disjoint_seeded_and_reproducible():
    texts = {split: {r["prompt"] for s in (0, 1) for r in make_word_problems(split, 200, seed=s)} for split in SPLITS}
    assert not texts["train"] & texts["validation"] and not texts["train"] & texts["test"]
    assert not texts["validation"] & texts["test"]
    assert all(split_of(t.split("\n")[0]) == split for split, ts in texts.items() for t in ts)
    assert make_word_problems("train", 20, seed=5) == make_word_problems("train", 20, seed=5)
    assert make_word_problems("train", 20, seed=5) != make_word_problems("train", 20, seed=6)
    assert {r["operations"] for r in make_word_problems("train", 50, operations=(1, 1))} == {1}


@pytest.mark.parametrize("split", sorted(SPLITS))
def test_easy_variant_is_one_small_addition(split):
    rows = make_word_problems(split, 100, seed=1, easy=True)
    assert WORD_PROBLEM_TASKS["word_problems_easy"].easy
    for row in rows:
        text, instruction = row["prompt"].split("\n")
        assert instruction == EASY_INSTRUCTION and split_of(text) == split
        assert _solve(row["prompt"]) == (int(row["answer"]), 1)
        start, more = (int(n) for n in re.findall(r"\d+", text))
        assert 2 <= start <= 9 and 1 <= more <= 9
    # the other tasks' problems are not drawn from the easy variant's stream
    assert {r["prompt"] for r in rows}.isdisjoint(r["prompt"] for r in make_word_problems(split, 100, seed=1))


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="split must be one of"):
        make_word_problems("dev", 3)
    with pytest.raises(ValueError, match=r"operations must be .* got \(0, 2\)"):
        make_word_problems("train", 3, operations=(0, 2))


@pytest.mark.parametrize(
    ("completion", "number"),
    [
        ("Answer: 42", 42.0),
        ("She has 3 + 4 = 7 apples.\nAnswer: 7 apples. Nice work on 12 problems!", 7.0),
        ("The answer is $1,250.", 1250.0),
        ("So 12 - 5 = 7. Final answer = 7 cents", 7.0),
        ("First 10, then 20, so 30 marbles in the end", 30.0),
        ("\\boxed{18}", 18.0),
        ("ANSWER:-3", -3.0),
        ("Answer: 1,000,000 dollars", 1000000.0),
        ("Answer: 12.0", 12.0),
        ("I do not know.", None),
    ],
)
def test_final_number_reads_how_people_write_numbers(completion, number):
    assert final_number(completion) == number


def test_word_problem_reward_is_a_named_reward():
    assert REWARD_FUNCTIONS["word_problem"] is word_problem_reward
    completions = ["Answer: 1,200 dollars", "Answer: 12", "the result is 7 pencils.", "no number here"]
    assert word_problem_reward(completions, ["1200", "13", "7", "4"]) == [1.0, 0.0, 1.0, 0.0]

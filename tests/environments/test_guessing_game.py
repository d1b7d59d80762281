"""The higher/lower guessing game (a text environment), against brute-force play and an exact expectation."""

from __future__ import annotations

from fractions import Fraction
from functools import cache

import pytest

from lit_entropy.environments.guessing_game import (
    GuessingGame,
    expected_turns_random_consistent,
    make_guessing_examples,
    speed_bonus,
    train_rows,
    validation_rows,
)


def _bisect(env: GuessingGame, low: int, high: int) -> tuple[int, float]:
    """Play bisection to the end; (turns, summed reward)."""
    total, turns = 0.0, 0
    while True:
        guess = (low + high) // 2
        observation, reward, done = env.step(f"{guess}")
        turns += 1
        total += reward
        if done:
            return turns, total
        if observation == "higher":
            low = guess + 1
        else:
            assert observation == "lower"
            high = guess - 1


@pytest.mark.parametrize("secret", range(1, 17))
def test_bisection_solves_every_number_and_is_paid_the_speed_bonus(secret: int) -> None:
    env = GuessingGame(max_turns=6)
    assert env.reset({"prompt": "guess1-16", "answer": str(secret)}) == ""
    turns, total = _bisect(env, 1, 16)
    # independent count: the bisection path length to ``secret`` over 1..16
    low, high, expected = 1, 16, 0
    while True:
        expected += 1
        mid = (low + high) // 2
        if mid == secret:
            break
        low, high = (mid + 1, high) if mid < secret else (low, mid - 1)
    assert turns == expected <= 5
    assert total == pytest.approx((6 - expected) / 6)


def test_feedback_invalid_turns_and_the_turn_limit() -> None:
    env = GuessingGame(max_turns=3)
    env.reset({"prompt": "guess1-16", "answer": "9"})
    assert env.step("no number here") == ("invalid", 0.0, False)
    assert env.step("guess 12, maybe 3") == ("lower", 0.0, False)  # the first integer counts
    assert env.step("4") == ("", 0.0, True)  # the third turn is the last: not solved, reward 0
    with pytest.raises(RuntimeError, match="ended"):
        env.step("9")
    env.reset({"prompt": "guess1-16", "answer": "9"})  # a reset starts a fresh game
    assert env.step("9") == ("", pytest.approx(2 / 3), True)


def test_last_turn_solve_pays_no_bonus_and_bounds_are_checked() -> None:
    env = GuessingGame(max_turns=2)
    env.reset({"prompt": "guess1-16", "answer": "1"})
    assert env.step("2") == ("lower", 0.0, False)
    assert env.step("1") == ("", 0.0, True)
    assert speed_bonus(1, 6) == pytest.approx(5 / 6)
    with pytest.raises(ValueError, match="outside"):
        env.reset({"prompt": "guess1-16", "answer": "17"})
    with pytest.raises(ValueError, match="max_turns"):
        GuessingGame(max_turns=0)
    with pytest.raises(ValueError, match="low and high"):
        GuessingGame(low=5, high=4)
    with pytest.raises(RuntimeError, match="before reset"):
        GuessingGame().step("3")


def test_expected_turns_of_a_random_consistent_guesser_matches_an_exact_recursion() -> None:
    @cache
    def expected(n: int) -> Fraction:
        # E[n] = 1 + (1/n) sum_g [ (g-1)/n * E[g-1] ... ] over the secret uniform on n values and the guess uniform
        if n == 0:
            return Fraction(0)
        total = Fraction(0)
        for g in range(1, n + 1):  # guess position g; the secret falls left (g-1 values) or right (n-g values)
            total += Fraction(g - 1, n) * expected(g - 1) + Fraction(n - g, n) * expected(n - g)
        return 1 + total / n

    for n in (1, 2, 5, 16, 32):
        assert expected_turns_random_consistent(n) == pytest.approx(float(expected(n)), rel=1e-12)


def test_rows_are_uniform_over_the_range_and_splits_are_fixed() -> None:
    rows = train_rows()
    assert len(rows) == 2048 and len(validation_rows()) == 128
    counts = [sum(r["answer"] == str(k) for r in rows) for k in range(1, 17)]
    assert min(counts) > 2048 / 16 * 0.6 and sum(counts) == 2048
    assert make_guessing_examples("train", 5) == rows[:5]
    assert rows[0]["prompt"] == "guess1-16"
    chat = make_guessing_examples("validation", 3, style="chat")
    assert "1 to 16" in chat[0]["prompt"] and [r["answer"] for r in chat] == [
        r["answer"] for r in validation_rows()[:3]
    ]
    with pytest.raises(ValueError, match="style"):
        make_guessing_examples("train", 1, style="emoji")

"""A higher/lower guessing game as a text environment: the policy guesses a hidden number, the game says
``higher`` or ``lower``, and solving in fewer turns pays more.

A text environment in the gym-like shape multi-turn rollouts take (``model.sampling.multi_turn.environment``):
``reset(row) -> observation``, ``step(text) -> (observation, reward, done)``. One instance plays one trajectory.
The hidden number is the row's ``answer``, in ``low..high`` (the row's ``low`` / ``high`` when it has them, else
the game's). A guess is the first integer of the policy's turn; a turn without one is answered ``invalid`` and
counts as a turn. The reward has two parts: the reward function reads the last turn (``exact_match``: the final
guess is the number, 1; a chat model's ``word_problem``: its final number), and the game adds a speed bonus
``(max_turns - t) / max_turns`` for solving on turn ``t`` (from ``1 - 1 / max_turns`` on the first turn to 0 on the
last). A game not solved in ``max_turns`` ends with 0.
Bisection solves 1..16 within 5 turns (3.4 on average), a guesser that only keeps its guesses consistent with the
feedback takes 4.2 on average (:func:`expected_turns_random_consistent`).

Rows come from :func:`make_guessing_examples`; the prompt has two styles: ``"tiny"`` (``"guess1-16"``, for the
character-level demo model) and ``"chat"`` (an instruction in words, for a chat model such as SmolLM2).
"""

from __future__ import annotations

import random
import re
from typing import Any

__all__ = [
    "GuessingGame",
    "expected_turns_random_consistent",
    "make_guessing_examples",
    "speed_bonus",
    "train_rows",
    "validation_rows",
    "chat_train_rows",
    "chat_validation_rows",
]

_INTEGER = re.compile(r"-?\d+")
#: Default range and turn limit of the game.
DEFAULT_LOW, DEFAULT_HIGH, DEFAULT_MAX_TURNS = 1, 16, 6
_SPLIT_SEEDS = {"train": 11, "validation": 12, "test": 13}
_CHAT_PROMPT = (
    "Let's play a guessing game. I am thinking of a whole number from {low} to {high}. Guess it: reply with one "
    "number only. After each guess I will say higher or lower."
)


def speed_bonus(turn: int, max_turns: int) -> float:
    """The game's reward for solving on turn ``turn`` (1-based) of at most ``max_turns``:
    ``(max_turns - turn) / max_turns``."""
    return (max_turns - turn) / max_turns


class GuessingGame:
    """One game of higher/lower (a text environment).

    Args:
        low: Smallest possible hidden number (a row's ``low`` overrides it).
        high: Largest possible hidden number (a row's ``high`` overrides it).
        max_turns: Guesses allowed; the game ends with reward 0 after the last one.
    """

    def __init__(self, low: int = DEFAULT_LOW, high: int = DEFAULT_HIGH, max_turns: int = DEFAULT_MAX_TURNS) -> None:
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or max_turns < 1:
            raise ValueError(f"GuessingGame: max_turns must be a positive int, got {max_turns!r}")
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high)) or low > high:
            raise ValueError(
                f"GuessingGame: low and high must be ints with low <= high, got low={low!r}, high={high!r}"
            )
        self.low, self.high, self.max_turns = low, high, max_turns
        self.secret: int | None = None
        self.turns = 0
        self.solved = False

    def reset(self, row: dict[str, Any]) -> str:
        """Start a game for ``row`` (hidden number ``row["answer"]``); the first observation is empty: the row's
        prompt already states the game."""
        low, high = int(row.get("low", self.low)), int(row.get("high", self.high))
        secret = int(row["answer"])
        if not low <= secret <= high:
            raise ValueError(f"GuessingGame: the hidden number {secret} is outside {low}..{high}")
        self.secret, self.turns, self.solved = secret, 0, False
        return ""

    def step(self, text: str) -> tuple[str, float, bool]:
        """Read one guess; answer ``higher`` / ``lower`` / ``invalid``, or end the game (solved: the speed bonus)."""
        if self.secret is None:
            raise RuntimeError("GuessingGame.step before reset")
        if self.solved or self.turns >= self.max_turns:
            raise RuntimeError("GuessingGame.step after the game ended")
        self.turns += 1
        match = _INTEGER.search(text)
        guess = int(match.group()) if match else None
        if guess == self.secret:
            self.solved = True
            return "", speed_bonus(self.turns, self.max_turns), True
        if self.turns >= self.max_turns:
            return "", 0.0, True
        if guess is None:
            return "invalid", 0.0, False
        return ("higher" if guess < self.secret else "lower"), 0.0, False


def make_guessing_examples(
    split: str, num_examples: int, *, low: int = DEFAULT_LOW, high: int = DEFAULT_HIGH, style: str = "tiny"
) -> list[dict[str, Any]]:
    """``num_examples`` games of ``split``: hidden numbers drawn uniformly from ``low..high`` (a fixed seed per split).

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"``.
        num_examples: Games to draw.
        low: Smallest hidden number.
        high: Largest hidden number.
        style: ``"tiny"`` (prompt ``"guess1-16"``) or ``"chat"`` (an instruction in words).

    Returns:
        ``{"prompt", "answer", "low", "high"}`` dicts; ``answer`` is the hidden number as a string.
    """
    if split not in _SPLIT_SEEDS:
        raise ValueError(f"split must be one of {tuple(_SPLIT_SEEDS)}, got {split!r}")
    if style not in ("tiny", "chat"):
        raise ValueError(f"style must be 'tiny' or 'chat', got {style!r}")
    prompt = f"guess{low}-{high}" if style == "tiny" else _CHAT_PROMPT.format(low=low, high=high)
    rng = random.Random(_SPLIT_SEEDS[split])
    return [
        {"prompt": prompt, "answer": str(rng.randint(low, high)), "low": low, "high": high} for _ in range(num_examples)
    ]


def train_rows() -> list[dict[str, Any]]:
    """2048 training games over 1..16 with the tiny prompt (``data.train_dataset``)."""
    return make_guessing_examples("train", 2048)


def validation_rows() -> list[dict[str, Any]]:
    """128 validation games over 1..16 with the tiny prompt."""
    return make_guessing_examples("validation", 128)


def chat_train_rows() -> list[dict[str, Any]]:
    """2048 training games over 1..16 with the chat prompt (a chat model, ``data.apply_chat_template: true``)."""
    return make_guessing_examples("train", 2048, style="chat")


def chat_validation_rows() -> list[dict[str, Any]]:
    """128 validation games over 1..16 with the chat prompt."""
    return make_guessing_examples("validation", 128, style="chat")


def expected_turns_random_consistent(n: int) -> float:
    """Expected guesses of a player who guesses uniformly among the numbers still consistent with the feedback,
    for a hidden number uniform over ``n`` values (no turn limit): ``2 (1 + 1/n) H_n - 3``.

    >>> round(expected_turns_random_consistent(16), 3)
    4.184
    """
    harmonic = sum(1 / k for k in range(1, n + 1))
    return 2 * (1 + 1 / n) * harmonic - 3

"""Build the guessing-game demonstration's base model ``lit_entropy/assets/tiny-qwen2-guess``.

A tiny Qwen2 (head_dim 64) over the character chat tokenizer (:mod:`lit_entropy.environments.char_chat`) is
supervised on games of higher/lower (:mod:`lit_entropy.environments.guessing_game`, 1..16, at most 6 turns) played
by a *random consistent* guesser: each guess is drawn uniformly from the numbers the feedback so far still allows
(4.2 turns on average, against bisection's 3.4). Loss on the guesses only::

    guess1-16 9<eos> lower 3<eos> higher 7<eos> lower 5<eos>        (no spaces in the real text)

The SFT stops at the first check (sampled at T = 1 against the real game) whose mean reward reaches ``--target``:
the model plays, imperfectly and without a preference for the middle, and reinforcement learning has the number
of turns to lower (bisection solves every game, mean reward 1 + 2.625 / 6 = 1.44; a random consistent guesser
solves 90 % within the 6 turns, mean reward 1.23).

    python -m scripts.assets.make_guessing_model   # a few minutes on 2 idle cores; deterministic
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from lit_entropy.environments.char_chat import build_char_chat_tokenizer
from lit_entropy.environments.guessing_game import DEFAULT_MAX_TURNS, GuessingGame, make_guessing_examples
from scripts.assets import sft
from scripts.assets.agent_rollout import play_text_environment, supervised_batch

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "lit_entropy" / "assets" / "tiny-qwen2-guess"
TURN_TOKENS = 4  # "16" then <eos>, with a spare token


def random_consistent_game(
    secret: int, low: int, high: int, max_turns: int, rng: random.Random
) -> list[dict[str, str]]:
    """One supervised game: the prompt, then guesses uniform over the numbers still consistent with the feedback."""
    messages = [{"role": "user", "content": f"guess{low}-{high}"}]
    for turn in range(max_turns):
        guess = rng.randint(low, high)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == secret or turn == max_turns - 1:
            break
        if guess < secret:
            messages.append({"role": "user", "content": "higher"})
            low = guess + 1
        else:
            messages.append({"role": "user", "content": "lower"})
            high = guess - 1
    return messages


@torch.no_grad()
def evaluate(model, tokenizer, rows: list[dict[str, str]], seed: int) -> dict[str, float]:
    """Mean reward (the final guess right, 1, plus the game's speed bonus), solve rate and turns of T = 1 games."""
    games = play_text_environment(
        model,
        tokenizer,
        rows,
        lambda: GuessingGame(max_turns=DEFAULT_MAX_TURNS),
        samples=1,
        seed=seed,
        max_turns=DEFAULT_MAX_TURNS,
        turn_tokens=TURN_TOKENS,
    )
    solved = [g.turns[-1].strip() == row["answer"] for g, row in zip(games, rows, strict=True)]
    rewards = [float(s) + g.reward for s, g in zip(solved, games, strict=True)]
    return {
        "mean_reward": sum(rewards) / len(games),
        "solve_rate": sum(solved) / len(games),
        "mean_turns": sum(len(g.turns) for g in games) / len(games),
    }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = sft.builder_parser(__doc__.split("\n\n")[0], DEFAULT_OUT)
    sft.add_sft_arguments(p, max_steps=3000, eval_every=50)
    p.add_argument("--eval-games", type=int, default=64)
    p.add_argument("--target", type=float, default=1.0, help="stop once the sampled mean reward reaches this")
    p.add_argument("--final-games", type=int, default=512)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    tokenizer = build_char_chat_tokenizer(model_max_length=96)
    model = sft.build_model(tokenizer, args.seed, TURN_TOKENS)
    val = make_guessing_examples("validation", max(args.eval_games, args.final_games))
    rng = random.Random(args.seed)

    def next_batch() -> dict[str, torch.Tensor]:
        games = [
            random_consistent_game(rng.randint(1, 16), 1, 16, DEFAULT_MAX_TURNS, rng) for _ in range(args.batch_size)
        ]
        return supervised_batch(games, tokenizer)

    fit = sft.supervise(
        model,
        next_batch,
        lambda: evaluate(model, tokenizer, val[: args.eval_games], seed=args.seed),
        lambda stats: stats["mean_reward"] >= args.target,
        lr=args.lr,
        max_steps=args.max_steps,
        eval_every=args.eval_every,
    )
    final = evaluate(model, tokenizer, val[: args.final_games], seed=args.seed + 1)
    sft.save(model, tokenizer, args.out)
    numbers = {f"val_{k}": round(v, 4) for k, v in final.items()}
    sft.write_report(
        args.out, sft.report(fit, model, t0, val_games=args.final_games, **numbers, args=sft.arguments(args))
    )


if __name__ == "__main__":
    main()

"""Rewards for verifiable tasks: batched ``(completions, answers) -> scores``.

- :mod:`~lit_entropy.rewards.scoring`: the reward-function protocol, calling one and checking its output (one
  finite float per completion, or named components), scoring a rollout batch.
- :mod:`~lit_entropy.rewards.registry`: the built-in rewards by name and resolving ``model.reward.fn``
  (a name, an import path ``pkg.module:function``, a callable); ``exact_match``.
- :mod:`~lit_entropy.rewards.math_answers`: ``\\boxed{}`` answers and the ``math_verify`` reward.
- :mod:`~lit_entropy.rewards.numeric_answers`: final numbers and the ``word_problem`` reward.
"""

from lit_entropy.rewards.math_answers import final_answer, last_boxed_content, math_verify_reward
from lit_entropy.rewards.numeric_answers import final_number, word_problem_reward
from lit_entropy.rewards.registry import REWARD_FUNCTIONS, exact_match_reward, resolve_reward_fn
from lit_entropy.rewards.scoring import (
    RewardFunction,
    RewardFunctionError,
    RewardScores,
    check_rewards,
    compute_reward_scores,
    compute_rewards,
    score_responses,
    score_rollout,
)

__all__ = [
    "REWARD_FUNCTIONS",
    "RewardFunction",
    "RewardFunctionError",
    "RewardScores",
    "check_rewards",
    "compute_reward_scores",
    "compute_rewards",
    "exact_match_reward",
    "final_answer",
    "final_number",
    "last_boxed_content",
    "math_verify_reward",
    "resolve_reward_fn",
    "score_responses",
    "score_rollout",
    "word_problem_reward",
]

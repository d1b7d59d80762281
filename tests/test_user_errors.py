"""Issue 11: a user's mistake ends in one clear message naming the setting or file and the value; no data is lost."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lit_entropy.rewards import check_rewards


# ----------------------------------------------------------------------------- reward outputs
def test_check_rewards_accepts_one_finite_number_per_completion():
    out = check_rewards("my_reward", [1, 0.5, np.float32(0.25), True], 4)
    assert out.dtype == torch.float32 and out.tolist() == [1.0, 0.5, 0.25, 1.0]
    assert check_rewards("t", torch.tensor([0.0, 2.0]), 2).tolist() == [0.0, 2.0]
    assert check_rewards("a", np.array([3.0]), 1).tolist() == [3.0]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ([1.0, 0.0], r"reward function 'my_reward' returned 2 rewards for 3 completions"),
        ([1.0, "1", 0.0], r"'my_reward': item 1 is '1' \(str\), not a number"),
        ([1.0, 0.0, None], r"'my_reward': item 2 is None \(NoneType\)"),
        ([1.0, math.nan, math.inf], r"'my_reward': item 1 is nan; rewards must be finite"),
        ([1.0, 0.0, math.inf], r"'my_reward': item 2 is inf"),
        (torch.tensor([[1.0, 0.0, 1.0]]), r"'my_reward' must return one number per completion \(3\), got a tensor"),
        ("101", r"'my_reward' must return a list of 3 floats.*str"),
        (None, r"'my_reward' must return a list of 3 floats.*NoneType"),
    ],
)
def test_bad_reward_outputs_name_the_function_and_the_first_offending_item(values, message):
    with pytest.raises(ValueError, match=message):
        check_rewards("my_reward", values, 3)

"""DAPO's soft overlong penalty and the truncated-row test against hand-computed values."""

from __future__ import annotations

import pytest
import torch

from lit_entropy.functional import check_overlong_args, overlong_penalty, truncated_rows


def test_penalty_is_zero_up_to_the_buffer_then_linear_to_minus_factor():
    # M = 16, B = 4, factor 0.5: 0 up to 12 tokens, then -(L - 12) / 4 * 0.5.
    lengths = torch.tensor([0, 12, 13, 16])
    out = overlong_penalty(lengths, max_new_tokens=16, buffer=4, factor=0.5)
    assert out.tolist() == [0.0, 0.0, -0.125, -0.5]
    assert out.dtype == torch.float32


def test_penalty_at_factor_one_and_buffer_one():
    lengths = torch.tensor([0, 7, 8])  # M = 8, B = 1: only the full-length row pays
    assert overlong_penalty(lengths, max_new_tokens=8, buffer=1, factor=1.0).tolist() == [0.0, 0.0, -1.0]


def test_zero_buffer_is_off():
    lengths = torch.tensor([0, 5, 16])
    assert overlong_penalty(lengths, max_new_tokens=16, buffer=0, factor=3.0).tolist() == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"buffer": 16}, "model.reward.overlong_buffer must be < model.sampling.max_new_tokens=16"),
        ({"buffer": -1}, "model.reward.overlong_buffer must be an integer >= 0, got -1"),
        ({"buffer": 2.0}, "model.reward.overlong_buffer must be an integer >= 0, got 2.0"),
        ({"factor": -0.5}, "model.reward.overlong_penalty_factor must be a finite number >= 0, got -0.5"),
        ({"factor": float("nan")}, "model.reward.overlong_penalty_factor must be a finite number >= 0, got nan"),
    ],
)
def test_bad_overlong_arguments_name_the_setting_and_value(kwargs, message):
    args = {"max_new_tokens": 16, "buffer": 4, "factor": 1.0, **kwargs}
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        check_overlong_args(**args, prefix="model.reward.")


def test_truncated_rows_need_the_full_budget_and_no_final_eos():
    eos = 7
    responses = torch.tensor(
        [
            [5, 5, 5, 5],  # 4 tokens, no EOS: truncated
            [5, eos, 0, 0],  # stopped early
            [5, 5, 5, eos],  # EOS exactly at the limit: stopped
            [5, 5, 5, 0],  # 3 tokens (< M) without EOS: not truncated by length
        ]
    )
    mask = torch.tensor([[t < n for t in range(4)] for n in (4, 2, 4, 3)])
    out = truncated_rows(responses, mask, max_new_tokens=4, eos_token_ids=[eos])
    assert out.tolist() == [True, False, False, False]
    # Without EOS ids only the length decides.
    assert truncated_rows(responses, mask, max_new_tokens=4, eos_token_ids=()).tolist() == [True, False, True, False]

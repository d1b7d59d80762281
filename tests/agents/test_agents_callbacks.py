"""Environment tokens never reach a token callback's statistics: inserting environment columns with extreme values
(mask False, as a multi-turn rollout has them) leaves every callback's output on the policy tokens unchanged."""

from __future__ import annotations

import pytest
import torch
from _token_callbacks import examples, random_context

from lit_entropy.callbacks import EntropyDynamicsMonitor
from lit_entropy.protocol import TokenMaskContext

ROWS, COLS, GROUP = 8, 10, 4
#: Where environment columns go in the widened batch (before these policy columns) and how many.
ENV_AT = {2: 3, 6: 2, COLS: 4}


def _policy_only(seed: int = 0) -> TokenMaskContext:
    return random_context(seed, ROWS, COLS, min_length=4, rewards=True)


def _policy_columns() -> torch.Tensor:
    """Index of each policy column in the widened batch."""
    out, shift = [], 0
    for col in range(COLS):
        shift += ENV_AT.get(col, 0)
        out.append(col + shift)
    return torch.tensor(out)


def _with_environment(context: TokenMaskContext) -> TokenMaskContext:
    """``context`` with environment columns inserted: masked out, every statistic extreme there."""
    width = COLS + sum(ENV_AT.values())
    cols = _policy_columns()
    extreme = {"advantages": 1e3, "discriminator": -1e3, "policy_average": 1e3, "entropy": 1e3, "old_logprobs": -1e3}
    fields = {}
    for name, value in extreme.items():
        wide = torch.full((ROWS, width), value, dtype=torch.float64)
        wide[:, cols] = getattr(context, name)
        fields[name] = wide
    mask = torch.zeros(ROWS, width, dtype=torch.bool)
    mask[:, cols] = context.mask
    return TokenMaskContext(mask=mask, rewards=context.rewards, **fields)


class _Module:
    """What the callbacks ask of a module outside a trainer."""

    def group_size(self):
        return GROUP

    def loss_coefficients(self):
        return {"entropy_coef": 0.01}


CALLBACKS = examples(GROUP)


def _outputs(callback, context):
    """Everything the callback gives the module for this batch, plus the metrics it computed."""
    module, out = _Module(), {}
    for method in ("token_advantages", "keep_mask", "token_penalty", "loss_coefficients"):
        if callable(getattr(callback, method, None)):
            out[method] = getattr(callback, method)(None, module, context)
    if isinstance(callback, EntropyDynamicsMonitor):
        callback.observe_keep_mask(None, module, context, context.mask)
    return out, dict(callback.last_metrics)


@pytest.mark.parametrize("name", sorted(CALLBACKS))
def test_environment_tokens_change_no_callback_output_on_policy_tokens(name):
    narrow = _policy_only()
    wide = _with_environment(narrow)
    cols = _policy_columns()
    reference, reference_metrics = _outputs(CALLBACKS[name](), narrow)
    got, metrics = _outputs(CALLBACKS[name](), wide)
    assert reference.keys() == got.keys() and (reference or reference_metrics)
    for key, value in reference.items():
        if isinstance(value, torch.Tensor) and value.dim() == 2:
            assert torch.equal(got[key][:, cols][narrow.mask], value[narrow.mask]), key
        else:
            assert got[key] == pytest.approx(value), key
    assert metrics == pytest.approx(reference_metrics)

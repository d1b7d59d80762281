"""The token-mask protocol: light imports, AND-combination of providers, shape checks."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from lit_entropy.protocol import (
    TokenMaskContext,
    TokenMaskProvider,
    TokenPenaltyProvider,
    collect_keep_mask,
    collect_token_penalty,
    required_token_mask_fields,
)


def test_protocol_imports_without_transformers_lightning_or_vllm():
    code = (
        "import sys, lit_entropy.protocol, lit_entropy.functional; "
        "print(sorted(m for m in ('transformers', 'vllm', 'lightning') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


class _Drop:
    """Drops the tokens at the given columns."""

    def __init__(self, columns, fields=("mask",)):
        self.columns = columns
        self.required_fields = frozenset(fields)

    def keep_mask(self, trainer, pl_module, context):
        keep = torch.ones_like(context.mask)
        keep[:, self.columns] = False
        return keep


class _Penalty:
    required_fields = frozenset({"advantages"})

    def __init__(self, value):
        self.value = value

    def token_penalty(self, trainer, pl_module, context):
        return torch.full(context.mask.shape, self.value)


def _context():
    mask = torch.tensor([[True, True, True, False], [True, True, False, False]])
    return TokenMaskContext(mask=mask, advantages=torch.ones(2, 4), entropy=torch.zeros(2, 4))


def test_keep_masks_combine_by_and_within_the_response_mask():
    trainer = SimpleNamespace(callbacks=[_Drop([0]), object(), _Drop([2], fields=("entropy",))])
    keep = collect_keep_mask(trainer, None, _context())
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert required_token_mask_fields(trainer) == {"mask", "entropy"}
    assert isinstance(trainer.callbacks[0], TokenMaskProvider)
    assert not isinstance(trainer.callbacks[1], TokenMaskProvider)


def test_no_provider_keeps_the_response_mask():
    context = _context()
    keep = collect_keep_mask(SimpleNamespace(callbacks=[]), None, context)
    assert torch.equal(keep, context.mask) and keep is not context.mask
    assert collect_token_penalty(SimpleNamespace(callbacks=[]), None, context) is None


def test_penalties_add_up():
    trainer = SimpleNamespace(callbacks=[_Penalty(0.5), _Penalty(0.25)])
    assert isinstance(trainer.callbacks[0], TokenPenaltyProvider)
    assert torch.all(collect_token_penalty(trainer, None, _context()) == 0.75)
    assert required_token_mask_fields(trainer) == {"advantages"}


def test_bad_shapes_and_dtypes_are_named():
    with pytest.raises(ValueError, match=r"TokenMaskContext.advantages has shape \(2, 3\)"):
        TokenMaskContext(mask=torch.ones(2, 4, dtype=torch.bool), advantages=torch.ones(2, 3))
    with pytest.raises(ValueError, match="must be a bool tensor"):
        TokenMaskContext(mask=torch.ones(2, 4), advantages=torch.ones(2, 4))

    class _Bad:
        required_fields = frozenset()

        def keep_mask(self, trainer, pl_module, context):
            return torch.ones(3, 3, dtype=torch.bool)

    with pytest.raises(ValueError, match=r"_Bad.keep_mask returned"):
        collect_keep_mask(SimpleNamespace(callbacks=[_Bad()]), None, _context())


def test_observers_see_the_final_and_of_all_providers():
    seen = []

    class _Observer:
        required_fields = frozenset({"entropy"})

        def observe_keep_mask(self, trainer, pl_module, context, keep):
            seen.append(keep.clone())

    observer = _Observer()
    # The observer comes first in callback order but still sees the mask after every provider.
    trainer = SimpleNamespace(callbacks=[observer, _Drop([0]), _Drop([2])])
    keep = collect_keep_mask(trainer, None, _context())
    assert len(seen) == 1 and torch.equal(seen[0], keep)
    assert keep.tolist() == [[False, True, False, False], [False, True, False, False]]
    assert required_token_mask_fields(trainer) == {"mask", "entropy"}

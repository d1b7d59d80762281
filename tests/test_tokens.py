"""Per-row tensors declared once as typed dataclass fields (lit_entropy.tokens): every declared field is sliced into
mini-batches, concatenated over micro-batches, detached and offered to callbacks, including one added to a group
(no other edit), and the type checker sees them. References are plain indexing and ``torch.cat`` per field."""

from __future__ import annotations

import dataclasses
import typing

import pytest
import torch

from lit_entropy import tokens
from lit_entropy.functional.entropy import EntropyStats
from lit_entropy.protocol import TokenMaskContext
from lit_entropy.rollout import RolloutBatch
from lit_entropy.step import Experience, ResponseForward, RolloutStatistics
from lit_entropy.tokens import ROLLOUT_FIELDS, RolloutField

N, T, P = 6, 5, 3


def _rollout(gen: torch.Generator) -> RolloutBatch:
    lengths = torch.tensor([5, 1, 3, 4, 2, 5])
    mask = torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)
    sequences = torch.randint(0, 50, (N, P + T), generator=gen)
    return RolloutBatch(sequences=sequences, attention_mask=torch.ones(N, P + T), response_mask=mask)


def _tensor(declared: RolloutField, gen: torch.Generator, grad: bool = False) -> torch.Tensor:
    """A distinct random tensor of the field's shape (bool for masks)."""
    shape = (N, T) if declared.per_token else (N,)
    if declared.name == "loss_mask":
        return torch.rand(shape, generator=gen) > 0.3
    return torch.randn(shape, generator=gen, dtype=torch.float64).requires_grad_(grad)


def _full_experience(gen: torch.Generator, grad: bool = False) -> tuple[Experience, dict[str, torch.Tensor]]:
    """An Experience with every declared field set (the late-declared ones as attributes)."""
    values = {f.name: _tensor(f, gen, grad) for f in ROLLOUT_FIELDS}
    rollout = _rollout(gen)
    forward = ResponseForward(EntropyStats(*(torch.zeros(N, T) for _ in range(3)), None))
    return Experience.from_row_tensors(values, rollout=rollout, update_forward=forward), values


STATISTICS = {
    "old_logprobs",
    "entropy",
    "discriminator",
    "policy_average",
    "ref_logprobs",
    "old_values",
    "kept_log_mass",
}
CONTEXT = {"rewards", "advantages", "old_logprobs", "entropy", "discriminator", "policy_average"}


def test_every_declared_field_is_a_keyword_field_of_its_holders():
    names = {f.name for f in dataclasses.fields(Experience)}
    assert {f.name for f in ROLLOUT_FIELDS} <= names and len(ROLLOUT_FIELDS) == 14
    assert {f.name for f in dataclasses.fields(RolloutStatistics)} == {*STATISTICS, "update_forward"}
    assert {f.name for f in RolloutStatistics.row_fields()} == STATISTICS
    assert {f.name for f in dataclasses.fields(TokenMaskContext)} == {"mask", *CONTEXT}
    for holder in (Experience, RolloutStatistics, TokenMaskContext):
        assert all(f.kw_only for f in dataclasses.fields(holder)), holder
    with pytest.raises(TypeError):  # built by keyword, never by position
        Experience(_rollout(torch.Generator().manual_seed(0)), torch.zeros(N))
    required = {f.name for f in ROLLOUT_FIELDS if f.required}
    assert required == {"rewards", "advantages", "old_logprobs", "entropy", "discriminator", "loss_mask"}
    assert [f.name for f in ROLLOUT_FIELDS if not f.per_token] == ["rewards"]
    with pytest.raises(TypeError, match="discriminator"):
        Experience(rollout=None, **{k: torch.zeros(N, T) for k in required if k != "discriminator"})
    with pytest.raises(TypeError, match="entropy"):
        RolloutStatistics(old_logprobs=torch.zeros(N, T), discriminator=torch.zeros(N, T))
    TokenMaskContext(mask=torch.ones(N, T, dtype=torch.bool))  # the callback context: every field optional
    with pytest.raises(dataclasses.FrozenInstanceError):  # read-only for the callbacks
        TokenMaskContext(mask=torch.ones(N, T, dtype=torch.bool)).entropy = torch.zeros(N, T)


def test_the_fields_are_visible_to_a_type_checker():
    """The annotations mypy reads: Experience's required fields are ``Tensor``, the context's ``Tensor | None``."""
    hints = typing.get_type_hints(tokens.RolloutRows)
    assert hints["penalty"] == torch.Tensor | None and hints["entropy"] is tokens.Filled
    assert hints["loss_mask"] is torch.Tensor
    assert typing.get_type_hints(tokens.RowScores)["rewards"] is tokens.Filled
    assert typing.get_args(TokenMaskContext.__orig_bases__[1]) == (torch.Tensor | None,)
    assert typing.get_args(tokens.RolloutRows.__orig_bases__[2]) == (torch.Tensor,)


def test_rows_select_every_declared_field_and_the_rollout():
    gen = torch.Generator().manual_seed(1)
    experience, values = _full_experience(gen)
    index = torch.tensor([4, 0, 3])
    rows = experience.rows(index)
    for declared in ROLLOUT_FIELDS:
        assert torch.equal(getattr(rows, declared.name), values[declared.name][index]), declared.name
    assert torch.equal(rows.rollout.sequences, experience.rollout.sequences[index])
    assert torch.equal(rows.response_mask, experience.response_mask[index])
    assert rows.update_forward is None, "the reused forward covers all rows: a mini-batch must not see it"
    assert experience.update_forward is not None and torch.equal(experience.rewards, values["rewards"])


@pytest.mark.parametrize("holder", ["experience", "statistics"])
def test_cat_of_row_slices_restores_every_declared_field(holder):
    gen = torch.Generator().manual_seed(2)
    experience, values = _full_experience(gen)
    source = experience
    if holder == "statistics":
        source = RolloutStatistics.from_row_tensors(values, update_forward=experience.update_forward)
    parts = [source.rows(slice(0, 2)), source.rows(slice(2, 3)), source.rows(slice(3, N))]
    joined = type(source).cat(parts)
    for declared in type(source).row_fields():
        assert torch.equal(getattr(joined, declared.name), values[declared.name]), declared.name
    missing = parts[1].with_row_tensors({"entropy": None})
    with pytest.raises(ValueError, match=r"cat: entropy is None in some parts and set in others"):
        type(source).cat([parts[0], missing])


def test_detach_covers_every_declared_field_and_keeps_the_update_forward():
    gen = torch.Generator().manual_seed(3)
    experience, values = _full_experience(gen, grad=True)
    detached = experience.detach()
    for declared in ROLLOUT_FIELDS:
        got, want = getattr(detached, declared.name), values[declared.name]
        assert not got.requires_grad and torch.equal(got, want.detach()), declared.name
    assert detached.update_forward is experience.update_forward


def test_from_passes_maps_the_entropy_statistics_by_name_and_detaches():
    gen = torch.Generator().manual_seed(4)
    logprobs, entropy, discriminator, average = (torch.randn(N, T, generator=gen, requires_grad=True) for _ in range(4))
    ref, values, kept = (torch.randn(N, T, generator=gen) for _ in range(3))
    stats = RolloutStatistics.from_passes(
        EntropyStats(logprobs, entropy, discriminator, average), ref_logprobs=ref, old_values=values, kept_log_mass=kept
    )
    expected = {
        "old_logprobs": logprobs,
        "entropy": entropy,
        "discriminator": discriminator,
        "policy_average": average,
        "ref_logprobs": ref,
        "old_values": values,
        "kept_log_mass": kept,
    }
    assert stats.row_tensors().keys() == expected.keys()
    for name, want in expected.items():
        got = getattr(stats, name)
        assert torch.equal(got, want.detach()) and not got.requires_grad, name


def test_the_callback_context_holds_exactly_the_context_fields():
    gen = torch.Generator().manual_seed(5)
    experience, values = _full_experience(gen)
    context = experience.token_context()
    assert torch.equal(context.mask, experience.response_mask)
    offered = {f.name for f in TokenMaskContext.row_fields()}
    assert offered == CONTEXT
    for name in offered:
        assert getattr(context, name) is values[name], name
    assert context.present_fields() == {"mask", *offered} == TokenMaskContext.field_names()
    for name in {f.name for f in ROLLOUT_FIELDS} - offered:  # the callbacks' own outputs, the PPO/KL extras
        assert not hasattr(context, name), name
    with pytest.raises(ValueError, match=r"TokenMaskContext.entropy has shape \(6, 4\), expected \(6, 5\)"):
        TokenMaskContext(mask=experience.response_mask, entropy=torch.zeros(N, T - 1))


@dataclasses.dataclass(kw_only=True)
class _Novelty(tokens.RowTensors):
    """A group with one more per-token statistic, as a new field in a group of lit_entropy.tokens would be."""

    novelty: torch.Tensor | None = tokens.row_field()


@dataclasses.dataclass(kw_only=True)
class _NovelStatistics(_Novelty, RolloutStatistics):
    pass


@dataclasses.dataclass(kw_only=True)
class _NovelExperience(_Novelty, Experience):
    pass


@dataclasses.dataclass(frozen=True, kw_only=True)
class _NovelContext(_Novelty, TokenMaskContext):
    pass


def test_a_field_added_to_a_group_reaches_a_mini_batch_and_the_callback_context():
    """No edit but the field: the statistics pass's parts carry it, the update's mini-batches slice it, the
    callbacks see it, and a wrong shape is refused by name."""
    gen = torch.Generator().manual_seed(6)
    rollout = _rollout(gen)
    full = torch.randn(N, T, generator=gen)
    parts = []
    for rows in (slice(0, 4), slice(4, N)):  # micro-batches of the statistics pass
        stats = {name: torch.randn(N, T, generator=gen)[rows] for name in ("old_logprobs", "entropy", "discriminator")}
        parts.append(_NovelStatistics(**stats, novelty=full[rows]))
    statistics = _NovelStatistics.cat(parts)
    assert torch.equal(statistics.novelty, full)
    extra = {"rewards": torch.zeros(N), "advantages": torch.zeros(N, T), "loss_mask": rollout.response_mask}
    experience = _NovelExperience.from_row_tensors({**statistics.row_tensors(), **extra}, rollout=rollout)
    assert torch.equal(experience.novelty, full)
    index = torch.tensor([5, 1, 2])
    assert torch.equal(experience.rows(index).novelty, full[index])
    assert torch.equal(experience.detach().rows(index).novelty, full[index])
    context = _NovelContext.of(experience, mask=experience.response_mask)
    assert torch.equal(context.novelty, full) and "novelty" in context.present_fields()
    assert "novelty" in _NovelContext.field_names()
    wrong = experience.with_row_tensors({"novelty": full[:, :-1]})
    with pytest.raises(ValueError, match=r"_NovelContext.novelty has shape \(6, 4\), expected \(6, 5\)"):
        _NovelContext.of(wrong, mask=experience.response_mask)


@dataclasses.dataclass(frozen=True, kw_only=True)
class _ScoredContext(TokenMaskContext):
    score: torch.Tensor | None = tokens.row_field(per_token=False)


def test_a_per_row_field_is_checked_against_the_row_count():
    mask = torch.ones(N, T, dtype=torch.bool)
    context = _ScoredContext.from_row_tensors({"score": torch.zeros(N)}, mask=mask)
    context.check_row_shapes(mask)
    bad = context.with_row_tensors({"score": torch.zeros(N, T)})
    with pytest.raises(ValueError, match=r"score has shape \(6, 5\), expected \(6,\) \(one value per row\)"):
        bad.check_row_shapes(mask)

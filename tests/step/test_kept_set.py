"""``model.loss.rollout_correction.kept_set_logprobs`` on the HF engine: the engine reports log-probs of the top-p
distribution it sampled from; renormalising the trainer's over the same kept set removes the mismatch."""

from __future__ import annotations

import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from lit_entropy.functional.rollout_correction import mismatch_metrics
from lit_entropy.rollout import HFRolloutEngine, RolloutBatch, SamplingConfig
from lit_entropy.settings import LossConfig, PolicyConfig, RFTSettings, RolloutCorrectionConfig, UpdateConfig
from lit_entropy.step import RolloutStatistics, build_experience, response_forward
from lit_entropy.step.kept_set import kept_set_log_mass


@pytest.mark.parametrize("top_k", [0, 4])
def test_the_kept_set_removes_the_top_p_mismatch_on_the_hf_engine(tiny_model_dir, top_k):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    sampling = SamplingConfig(num_samples=4, temperature=0.9, top_p=0.5, top_k=top_k, max_new_tokens=8)
    prompt = torch.tensor([[5, 6, 7, 8], [0, 9, 8, 7]])
    torch.manual_seed(2)
    rollout = HFRolloutEngine(eos_token_id=1, pad_token_id=0).generate(model, prompt, (prompt > 0).long(), sampling)
    rewards = torch.arange(8, dtype=torch.float32) % 2
    metrics = {}
    for kept in (False, True):
        correction = RolloutCorrectionConfig(level="token", kept_set_logprobs=kept)
        settings = RFTSettings.build(sampling=sampling, loss=LossConfig(rollout_correction=correction))
        with torch.no_grad():
            stats = response_forward(model, rollout, temperature=sampling.temperature).stats
        mass = kept_set_log_mass(model, rollout, settings)
        assert (mass is None) == (not kept)
        statistics = RolloutStatistics.from_passes(stats, kept_log_mass=mass)
        exp = build_experience(rollout, rewards, statistics, settings)
        metrics[kept] = mismatch_metrics(exp.mismatch)
    # Without: trainer minus engine log-prob is log(kept mass) < 0 at every filtered step, so k1 = -E[log mass].
    assert metrics[False]["kl_k1"] > 0.05 and metrics[False]["ppl_ratio"] < 0.95
    assert abs(metrics[True]["kl_k1"]) < 1e-5 and metrics[True]["kl_k3"] < 1e-8
    assert metrics[True]["ppl_ratio"] == pytest.approx(1.0, abs=1e-5) and metrics[True]["ess"] > 1 - 1e-8


def _tied_rollout_model(tiny_model_dir):
    """The tiny Qwen2 with LM-head rows 10..15 zeroed (their logits are exactly 0 everywhere: ties that top-k's
    k-th score falls on) and a rollout of 4 rows with mixed prompt and response lengths (P = 5, T = 7)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    with torch.no_grad():
        model.lm_head.weight[10:16] = 0.0  # tied with the input embeddings; no input below uses these ids
    gen = torch.Generator().manual_seed(3)
    sequences = torch.randint(2, 10, (4, 12), generator=gen)
    prompt_pad = torch.tensor([0, 2, 1, 4])
    response_len = torch.tensor([7, 3, 5, 1])
    positions = torch.arange(12)
    attention = (positions >= prompt_pad[:, None]) & (positions < 5 + response_len[:, None])
    sequences = sequences.masked_fill(~attention, 0)
    rollout = RolloutBatch(
        sequences=sequences,
        attention_mask=attention.long(),
        response_mask=attention[:, 5:],
        rollout_logprobs=torch.zeros(4, 7),
    )
    return model, rollout


def _reference_kept_log_mass(model, rollout, temperature, top_k, top_p):
    """Brute force in float64 from the model's own full logits: the top-k set (ties at the k-th score kept), then
    top-p on the top-k-renormalised distribution (ascending order, drop cumulative <= 1 - top_p, keep the best),
    the log of the full softmax's mass on what is left; also the largest top-k set (to show the ties mattered)."""
    attention = rollout.attention_mask
    with torch.no_grad():
        logits = model(
            input_ids=rollout.sequences,
            attention_mask=attention,
            position_ids=(attention.cumsum(-1) - 1).clamp(min=0),
            use_cache=False,
        ).logits
    prompt, mask = rollout.prompt_length, rollout.response_mask
    ref, widest = torch.zeros(mask.shape, dtype=torch.float64), 0
    for i, t in mask.nonzero().tolist():
        scores = logits[i, prompt - 1 + t].double() / temperature
        p = scores.softmax(-1)
        keep = torch.ones_like(scores, dtype=torch.bool)
        if 0 < top_k < scores.numel():
            kth = sorted(scores.tolist(), reverse=True)[top_k - 1]
            keep = scores >= kth
            widest = max(widest, int(keep.sum()))
        if top_p < 1.0:
            kept_ids = [j for j in range(scores.numel()) if keep[j]]
            q = {j: p[j].item() / p[keep].sum().item() for j in kept_ids}
            ascending, cumulative = sorted(kept_ids, key=lambda j: q[j]), 0.0
            for rank, j in enumerate(ascending):
                cumulative += q[j]
                if cumulative <= 1.0 - top_p and rank < len(ascending) - 1:
                    keep[j] = False
        ref[i, t] = math.log(p[keep].sum().item())
    return ref, widest


class _WrappedHead(torch.nn.Module):
    """An LM head that is not an ``nn.Linear`` (as a LoRA-adapted head is): the blockwise path cannot read it."""

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.linear = linear

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.linear(hidden)


def _with_head(model, head: str):
    """``head``: ``linear`` (as loaded), ``wrapped`` (:class:`_WrappedHead`) or ``transformed`` (a config logit
    transform that the kept set cannot reproduce from the head alone; Qwen2's forward ignores the attribute, so the
    logits, and the reference, stay the same)."""
    if head == "wrapped":
        model.set_output_embeddings(_WrappedHead(model.get_output_embeddings()))
    elif head == "transformed":
        model.config.final_logit_softcapping = 30.0
    return model


@pytest.mark.parametrize(
    ("blockwise", "packed", "head"),
    [(True, False, "linear"), (False, False, "linear"), (True, True, "linear"), (True, False, "wrapped"),
     (True, True, "wrapped"), (True, False, "transformed"), (True, True, "transformed")],
)  # fmt: skip
@pytest.mark.parametrize(("top_k", "top_p"), [(8, 1.0), (0, 0.6), (8, 0.8)])
def test_kept_set_log_mass_matches_a_float64_brute_force(tiny_model_dir, top_k, top_p, blockwise, packed, head):
    model, rollout = _tied_rollout_model(tiny_model_dir)
    model = _with_head(model, head)
    sampling = SamplingConfig(num_samples=2, temperature=0.7, top_p=top_p, top_k=top_k, max_new_tokens=7)
    settings = RFTSettings.build(
        sampling=sampling,
        loss=LossConfig(rollout_correction=RolloutCorrectionConfig(level="token", kept_set_logprobs=True)),
        policy=PolicyConfig(logprob_chunk_size=3, blockwise_lm_head=blockwise),
        update=UpdateConfig(pack_sequences=packed),
    )
    got = kept_set_log_mass(model, rollout, settings)
    ref, widest = _reference_kept_log_mass(model, rollout, 0.7, top_k, top_p)
    assert got.dtype == torch.float32 and got.shape == rollout.response_mask.shape
    assert torch.equal(got[~rollout.response_mask], torch.zeros(int((~rollout.response_mask).sum())))
    torch.testing.assert_close(got.double(), ref, rtol=0, atol=2e-6)
    assert (ref[rollout.response_mask] < -1e-3).all()  # every position loses mass to the filter
    if top_k:
        assert widest > top_k  # a k-th score tied with the zeroed tokens' 0 kept more than k tokens


class _LargestVocabTensor(TorchDispatchMode):
    """Records the most elements of any newly allocated tensor (sharing no input's storage: no view, no ``out=``
    argument) whose last dimension is the vocabulary, over every aten op run inside the mode."""

    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab, self.largest = vocab, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = tree_flatten((args, kwargs))[0]
        storages = {t.untyped_storage().data_ptr() for t in inputs if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == self.vocab:
                if t.untyped_storage().data_ptr() not in storages:
                    self.largest = max(self.largest, t.numel())
        return out


@pytest.mark.parametrize(("head", "packed"), [("linear", False), ("linear", True), ("wrapped", False)])
def test_kept_set_log_mass_holds_one_chunk_of_vocabulary_sized_tensors(tiny_model_dir, head, packed):
    model, rollout = _tied_rollout_model(tiny_model_dir)
    model = _with_head(model, head)
    vocab, rows = model.config.vocab_size, 3
    sampling = SamplingConfig(num_samples=2, temperature=0.7, top_p=0.6, top_k=8, max_new_tokens=7)
    settings = RFTSettings.build(
        sampling=sampling,
        loss=LossConfig(rollout_correction=RolloutCorrectionConfig(level="token", kept_set_logprobs=True)),
        policy=PolicyConfig(logprob_chunk_size=rows),
        update=UpdateConfig(pack_sequences=packed),
    )
    assert rollout.response_mask.sum() > rows  # several chunks; the old full-logits pass held all 4 x 7 rows
    with _LargestVocabTensor(vocab) as seen:
        kept_set_log_mass(model, rollout, settings)
    assert 0 < seen.largest <= rows * vocab


def test_packed_kept_set_equals_the_padded_one_on_mixed_lengths(tiny_model_dir):
    """The packed layout (bins of the sdpa path) gives the padded pass's values, position by position."""
    model, rollout = _tied_rollout_model(tiny_model_dir)
    model = model.double()
    sampling = SamplingConfig(num_samples=2, temperature=0.7, top_p=0.8, top_k=8, max_new_tokens=7)
    out, calls = [], []
    hook = model.register_forward_pre_hook(lambda _, args, kwargs: calls.append(kwargs), with_kwargs=True)
    for packed in (False, True):
        settings = RFTSettings.build(
            sampling=sampling,
            loss=LossConfig(rollout_correction=RolloutCorrectionConfig(level="token", kept_set_logprobs=True)),
            policy=PolicyConfig(logprob_chunk_size=3),
            update=UpdateConfig(pack_sequences=packed),
        )
        seen = len(calls)
        out.append(kept_set_log_mass(model, rollout, settings))
        (call,) = calls[seen:]  # one forward, packed: no attention mask, fewer positions than the padded rows
        assert (call["attention_mask"] is None) == packed
        assert (call["input_ids"].numel() < rollout.sequences.numel()) == packed
    hook.remove()
    padded, packed_mass = out
    assert rollout.attention_mask.sum(-1).unique().numel() > 2  # rows of different real lengths
    assert (padded[rollout.response_mask] < -1e-3).all()
    torch.testing.assert_close(packed_mass, padded, rtol=0, atol=1e-6)  # float32 scores from float64 logits

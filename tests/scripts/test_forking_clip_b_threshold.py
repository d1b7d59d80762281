"""scripts/studies/horizon/clip_b_threshold.py: per-token log p, entropy and valid mask against a one-sequence float64
recomputation, and Clip_B's threshold and masked counts against a hand computation of the rule."""

from __future__ import annotations

import json
import math

import pytest
import torch
from _scripts import load_script


def _short_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    th = load_script("scripts.studies.horizon.clip_b_threshold")
    spec = th.EXPERIMENTS["short"]
    tok = AutoTokenizer.from_pretrained(spec["models"] / "fork-s0")
    model = AutoModelForCausalLM.from_pretrained(spec["models"] / "fork-s0").eval()
    rows = [json.loads(x) for x in (spec["data"] / "train.jsonl").read_text().splitlines()[:64]]
    return th, tok, model, rows


def test_response_stats_against_one_sequence_float64_forward():
    th, tok, model, rows = _short_model()
    torch.set_num_threads(1)
    prompts = [r["prompt"] for r in rows[:6]]
    s = th.response_stats(model, tok, prompts, 10, seed=3)
    model64 = model.double()
    for i, prompt in enumerate(prompts):
        ids = tok(prompt, add_special_tokens=False)["input_ids"]
        n = int(s["valid"][i].sum())
        response = tok(s["texts"][i], add_special_tokens=False)["input_ids"]
        assert s["valid"][i, :n].all() and not s["valid"][i, n:].any()
        ended = n == len(response) + 1  # the valid tokens end with <eos> unless the response hit the length cap
        assert ended or (n == 10 and len(response) == 10)
        full = torch.tensor([ids + response + ([tok.eos_token_id] if ended else [])])
        with torch.no_grad():
            logits = model64(full).logits[0, len(ids) - 1 : -1]
        for t in range(n):
            q = logits[t].softmax(-1)
            assert s["logp"][i, t].item() == pytest.approx(math.log(q[full[0, len(ids) + t]].item()), abs=1e-4)
            assert s["entropy"][i, t].item() == pytest.approx(-(q * q.log()).sum().item(), abs=1e-4)
    model.float()


def test_one_batch_threshold_and_masked_counts_by_hand():
    th, tok, model, rows = _short_model()
    torch.set_num_threads(1)
    mu = 0.5  # low enough that the rule masks something on this batch
    got = th.one_batch(model, tok, rows, mu, 10, seed=1)
    g = torch.Generator().manual_seed(1)  # the same draw of prompts and samples as one_batch's
    picked = [rows[i] for i in torch.randint(len(rows), (th.PROMPTS,), generator=g).tolist()]
    prompts = [r["prompt"] for r in picked for _ in range(th.GROUP)]
    s = th.response_stats(model, tok, prompts, 10, 1)
    valid = s["valid"].tolist()
    disc = [
        [math.exp(lp) * (h + lp) for lp, h in zip(a, b, strict=True)]
        for a, b in zip(s["logp"].tolist(), s["entropy"].tolist(), strict=True)
    ]
    values = [v for row, ok in zip(disc, valid, strict=True) for v, o in zip(row, ok, strict=True) if o]
    mean = sum(values) / len(values)
    std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
    assert got["threshold"] == pytest.approx(mean - mu * std, abs=1e-5)
    assert got["std"] == pytest.approx(std, abs=1e-5)
    rewards = [
        float(t.strip() == r["answer"]) for t, r in zip(s["texts"], [r for r in picked for _ in range(8)], strict=True)
    ]
    adv = []
    for k in range(th.PROMPTS):
        grp = rewards[k * th.GROUP : (k + 1) * th.GROUP]
        m = sum(grp) / len(grp)
        sd = math.sqrt(sum((x - m) ** 2 for x in grp) / (len(grp) - 1))
        adv += [0.0 if sd == 0 else (x - m) / (sd + 1e-6) for x in grp]
    masked = [
        [ok and a < 0 and v - mean < -mu * std for v, ok in zip(row, oks, strict=True)]
        for row, oks, a in zip(disc, valid, adv, strict=True)
    ]
    assert got["masked_strategy"] == sum(row[0] for row in masked)
    assert got["masked_exec"] == sum(sum(row[1:]) for row in masked)
    assert got["masked_strategy"] + got["masked_exec"] > 0
    assert [letter for letter, _ in got["strategy_S"]] == [t[:1] for t in s["texts"]]

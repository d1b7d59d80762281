"""RFTModule: log-prob bookkeeping against an independent forward, short fits for GRPO/PPO with Clip_B/Clip_V."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger

from lit_entropy.callbacks import EntropyDiscriminatorClipping
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import SamplingConfig
from lit_entropy.settings import (
    EvaluationConfig,
    LossConfig,
    OptimConfig,
    PolicyConfig,
    RewardConfig,
    UpdateConfig,
)


def _fit(model_dir, tmp_path, callbacks=(), batches=3, **settings):
    seed_everything(0)
    defaults = dict(
        policy=PolicyConfig(model_dir),
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        optim=OptimConfig(lr=1e-3),
        evaluation=EvaluationConfig(num_samples=4),
    )
    module = RFTModule(**{**defaults, **settings})
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=4, num_train_examples=32, num_val_examples=8)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=batches,
        logger=TensorBoardLogger(tmp_path, name="run", default_hp_metric=False),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=1,
        val_check_interval=batches,
        log_every_n_steps=1,
        callbacks=list(callbacks),
    )
    trainer.fit(module, data)
    return module, trainer


def _logged_tags(trainer) -> set[str]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    tags = events.Tags()
    return set(tags["scalars"]) | set(tags["histograms"]) | set(tags.get("tensors", []))


def test_old_logprobs_match_an_unpadded_forward(tiny_model_dir):
    """Left padding + position ids + temperature: the no-grad pass equals a per-row full-softmax reference."""
    seed_everything(0)
    sampling = SamplingConfig(num_samples=3, max_new_tokens=5, temperature=0.7)
    module = RFTModule(PolicyConfig(tiny_model_dir), sampling=sampling)
    module.configure_model()
    module.setup("fit")
    tok = module.tokenizer
    prompts = ["1+2=", "13-27=", "7+8="]  # different lengths -> left padding
    enc = tok(prompts, return_tensors="pt", padding=True)
    batch = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"], "answers": ["3", "-14", "15"]}
    rollout = module.generate(batch, sampling)
    rewards, _ = module.score(batch, rollout, sampling.num_samples)

    exp = module.make_experience(rollout, rewards)  # no trainer: no mask providers
    policy = module.policy
    for row in range(rollout.sequences.shape[0]):
        real = rollout.attention_mask[row].bool()
        ids = rollout.sequences[row][real].unsqueeze(0)  # no padding at all
        n_resp = int(rollout.response_mask[row].sum())
        with torch.no_grad():
            logits = policy(input_ids=ids).logits[0].double() / 0.7
        logp = torch.log_softmax(logits, -1)
        prompt_len = ids.shape[1] - n_resp
        targets = ids[0, prompt_len:]
        reference = logp[prompt_len - 1 : -1].gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        got = exp.old_logprobs[row, :n_resp].double()
        torch.testing.assert_close(got, reference, atol=1e-4, rtol=1e-4)
        p = logp[prompt_len - 1 : -1].exp()
        entropy = -(p * logp[prompt_len - 1 : -1]).sum(-1)
        torch.testing.assert_close(exp.entropy[row, :n_resp].double(), entropy, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize(
    ("algorithm", "method", "extra"),
    [
        ("grpo", None, {"loss": LossConfig(kl_coef=0.05, entropy_coef=0.01, loss_agg_mode="seq-mean-token-mean")}),
        ("grpo", "clip_b", {"update": UpdateConfig(epochs=2, mini_batch_size=8, micro_batch_size=4)}),
        (
            "grpo",
            "clip_v",
            {
                "loss": LossConfig(clip_ratio_high=0.28),
                "optim": OptimConfig(lr=1e-3, lr_schedule="cosine", warmup_steps=1),
            },
        ),
        ("ppo", "clip_b", {"update": UpdateConfig(epochs=2, mini_batch_size=8)}),
        ("ppo", "clip_v", {"loss": LossConfig(kl_coef=0.1, kl_type="k1")}),
    ],
)
def test_short_fit_logs_the_documented_tags(tiny_model_dir, tmp_path, algorithm, method, extra):
    callbacks = [EntropyDiscriminatorClipping(method, mu=1.0, max_frac=0.1)] if method else []
    module, trainer = _fit(tiny_model_dir, tmp_path, callbacks=callbacks, algorithm=algorithm, **extra)
    loss, update = extra.get("loss", LossConfig()), extra.get("update", UpdateConfig())
    tags = _logged_tags(trainer)
    expected = {
        "train/reward_mean",
        "train/entropy",
        "train/clip_ratio",
        "train/clip_ratio_low",
        "train/clip_ratio_high",
        "train/response_length",
        "train/grad_norm",
        "train/lr",
        "val/avg@4",
        "val/pass@1",
        "val/pass@2",
        "val/pass@4",
        "train/token_entropy",
    }
    if method:
        expected |= {"train/entropy_clip_frac", "train/entropy_clip_frac_neg"}
    if loss.kl_coef:
        expected.add("train/kl")
    if algorithm == "ppo":
        expected.add("train/value_loss")
    assert expected <= tags, expected - tags
    assert trainer.global_step == 3 * update.epochs * (16 // (update.mini_batch_size or 16))
    for p in module.policy.parameters():
        assert torch.isfinite(p).all()


def test_reference_model_stays_out_of_checkpoints(tiny_model_dir, tmp_path):
    module, trainer = _fit(tiny_model_dir, tmp_path, batches=1, loss=LossConfig(kl_coef=0.1))
    path = tmp_path / "last.ckpt"
    trainer.save_checkpoint(path)
    state = torch.load(path, weights_only=False)["state_dict"]
    assert any(k.startswith("policy.") for k in state)
    assert not any(k.startswith("ref_model.") for k in state)
    restored = RFTModule.load_from_checkpoint(path)
    restored.configure_model()
    torch.testing.assert_close(restored.ref_model.state_dict(), module.ref_model.state_dict())


def test_prompts_longer_than_the_context_fail_at_setup(tiny_model_dir, tmp_path):
    module = RFTModule(PolicyConfig(tiny_model_dir), sampling=SamplingConfig(num_samples=2, max_new_tokens=60))
    data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=2, num_train_examples=8)
    trainer = Trainer(accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False)
    with pytest.raises(ValueError, match=r"max_new_tokens=60 exceed the model's context max_position_embeddings=64"):
        trainer.fit(module, data)


def _parity_reward(completions, answers):
    """A reward a random model earns half the time: varied advantages without a trained model."""
    return [float(len(c) % 2) for c in completions]


@pytest.mark.parametrize("method", [None, "clip_v"])
def test_fused_single_update_equals_the_separate_no_grad_pass(tiny_model_dir, tmp_path, method):
    """One update per batch: reusing the update's forward for the old log-probs changes nothing."""
    weights = []
    for fuse in (True, False):
        callbacks = [EntropyDiscriminatorClipping(method, mu=1.0, max_frac=0.1)] if method else []
        module, trainer = _fit(
            tiny_model_dir,
            tmp_path / str(fuse),
            callbacks=callbacks,
            batches=1,
            update=UpdateConfig(fuse_old_logprob_pass=fuse),
            reward=RewardConfig(fn=_parity_reward),
            loss=LossConfig(entropy_coef=0.01),
        )
        assert module.fuses_old_logprob_pass(16) is fuse
        weights.append({k: v.detach().clone() for k, v in module.policy.state_dict().items()})
        if method:
            masked = callbacks[0].num_masked
    fused, separate = weights
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(fused[name], initial[name]) for name in initial), "the update must move weights"
    for name in fused:
        # Adam's first step is ~lr * sign(g) = 1e-3 per weight: 1e-5 is 1% of a step (summation-order noise).
        torch.testing.assert_close(fused[name], separate[name], atol=1e-5, rtol=1e-4)
    if method:
        assert masked > 0

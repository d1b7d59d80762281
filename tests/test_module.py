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


@pytest.mark.parametrize("blockwise", [True, False])
def test_old_logprobs_match_an_unpadded_forward(tiny_model_dir, blockwise):
    """Left padding + position ids + temperature: the no-grad pass equals a per-row full-softmax reference,
    through the blockwise (hidden states x LM head) and the full-logits vocabulary pass alike."""
    seed_everything(0)
    sampling = SamplingConfig(num_samples=3, max_new_tokens=5, temperature=0.7)
    module = RFTModule(PolicyConfig(tiny_model_dir, blockwise_lm_head=blockwise), sampling=sampling)
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
    callbacks = [EntropyDiscriminatorClipping(method, mu=0.5, max_frac=0.1)] if method else []
    module, trainer = _fit(tiny_model_dir, tmp_path, callbacks=callbacks, algorithm=algorithm, **extra)
    loss, update = extra.get("loss", LossConfig()), extra.get("update", UpdateConfig())
    tags = _logged_tags(trainer)
    expected = {
        *(f"train/reward/{s}" for s in ("mean", "std", "frac_zero_std")),
        *(f"train/update/advantage/{s}" for s in ("mean", "std", "min", "max")),
        *(f"train/length/{s}" for s in ("mean", "min", "max", "truncated_frac")),
        "train/entropy/mean",
        "train/loss/policy",
        "train/optim/grad_norm",
        *(f"perf/{s}" for s in ("time_generate_s", "time_score_s", "time_statistics_s", "time_update_s")),
        "perf/tokens_per_s",
        "perf/peak_memory_mb",
        *(f"overview/{s}" for s in ("1_reward", "2_val_avg@4", "3_val_pass@4", "4_entropy", "5_length")),
        "overview/8_tokens_per_s",
        "val/avg@4",
        "val/pass@2",
        "val/pass@4",
        "val/length/mean",
        "train/entropy/tokens",
        "train/samples/text_summary",
        "custom_scalars__config__",  # the CUSTOM SCALARS layout
        # HF generate reports the log-probs it sampled from: the mismatch metrics (no correction: no bounds)
        *(f"train/rollout/{s}" for s in ("logprob_gap_mean", "logprob_gap_max", "kl_k1", "kl_k3", "ppl_ratio", "ess")),
    }
    if method:
        expected |= {"train/entropy_clip/frac", "train/entropy_clip/frac_neg", "train/entropy_clip/s_mean"}
        expected |= {"train/entropy/kept", "overview/7_masked_frac"}
        if callbacks[0].num_acted_on:  # logged in the steps that masked a token
            expected.add("train/entropy/masked")
    if method == "clip_v":
        expected.add("train/entropy_clip/centred_s_mean")
    if loss.kl_coef:
        expected.add("train/loss/kl")
    if loss.entropy_coef:
        expected.add("train/loss/entropy_bonus")
    if algorithm == "ppo":
        expected.add("train/loss/value")
    if update.epochs > 1 or update.mini_batch_size:  # more than one optimizer step per rollout batch
        expected |= {
            "train/clip/ratio",
            "train/clip/low",
            "train/clip/high",
            "train/clip/approx_kl",
            "overview/6_clip_frac",
        }
        if algorithm == "ppo":
            expected.add("train/clip/value")
        if loss.policy_loss == "ppo" and loss.clip_ratio_c is not None:  # the dual clip (3.0 by default)
            expected.add("train/clip/dual")
    if "optim" in extra:  # cosine with warm-up: the LR changes
        expected.add("train/optim/lr")
    assert tags == expected, (expected - tags, tags - expected)
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


def test_a_checkpoint_with_groups_saved_at_the_top_loads_them_in_their_new_place(tiny_model_dir, tmp_path):
    """``model.async_rollout`` / ``model.multi_turn`` (until issue 33.5) and ``model.rollout_correction`` sat at the top
    of HPARAMS; ``load_from_checkpoint`` reads them into ``model.sampling`` / ``model.loss`` (Lightning alone would
    drop keys ``__init__`` does not name)."""
    import copy

    import lightning

    from lit_entropy.settings import RolloutCorrectionConfig

    sampling = {"num_samples": 2, "async_rollout": {"max_staleness": 0}}
    correction = RolloutCorrectionConfig(level="token", upper=3.0)
    module = RFTModule(PolicyConfig(tiny_model_dir), sampling=sampling, loss=LossConfig(rollout_correction=correction))
    module.configure_model()
    hparams = copy.deepcopy(dict(module.hparams))
    hparams["async_rollout"] = hparams["sampling"].pop("async_rollout")
    hparams["multi_turn"] = hparams["sampling"].pop("multi_turn")  # null, as every older checkpoint stored it off
    hparams["rollout_correction"] = hparams["loss"].pop("rollout_correction")
    path = tmp_path / "old.ckpt"
    version = lightning.__version__
    torch.save(
        {"state_dict": module.state_dict(), "hyper_parameters": hparams, "pytorch-lightning_version": version}, path
    )
    loaded = RFTModule.load_from_checkpoint(path)
    assert loaded.settings == module.settings and loaded.settings.sampling.async_rollout.max_staleness == 0
    assert loaded.settings.loss.rollout_correction == correction
    assert RFTModule.load_from_checkpoint(path, loss={"kl_coef": 0.5}).settings.loss.kl_coef == 0.5  # given wins


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
def test_reused_statistics_forward_equals_the_separate_no_grad_pass(tiny_model_dir, tmp_path, method):
    """One update per batch: reusing the update's forward for the old log-probs changes nothing."""
    weights = []
    for reuse in (True, False):
        callbacks = [EntropyDiscriminatorClipping(method, mu=0.5, max_frac=0.1)] if method else []
        module, trainer = _fit(
            tiny_model_dir,
            tmp_path / str(reuse),
            callbacks=callbacks,
            batches=1,
            update=UpdateConfig(reuse_statistics_forward=reuse),
            reward=RewardConfig(fn=_parity_reward),
            loss=LossConfig(entropy_coef=0.01),
        )
        assert module.reuses_statistics_forward(16) is reuse
        weights.append({k: v.detach().clone() for k, v in module.policy.state_dict().items()})
        if method:
            masked = callbacks[0].num_acted_on
    reused, separate = weights
    from transformers import AutoModelForCausalLM

    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir).state_dict()
    assert any(not torch.equal(reused[name], initial[name]) for name in initial), "the update must move weights"
    for name in reused:
        # Adam's first step is ~lr * sign(g) = 1e-3 per weight: 1e-5 is 1% of a step (summation-order noise).
        torch.testing.assert_close(reused[name], separate[name], atol=1e-5, rtol=1e-4)
    if method:
        assert masked > 0


def test_blockwise_lm_head_trains_like_full_logits(tiny_model_dir, tmp_path):
    """The blockwise vocabulary pass (no logits) takes the same updates as full logits + entropy_stats."""
    weights, logged = [], []
    for blockwise in (True, False):
        module, trainer = _fit(
            tiny_model_dir,
            tmp_path / str(blockwise),
            batches=2,
            policy=PolicyConfig(tiny_model_dir, blockwise_lm_head=blockwise),
            update=UpdateConfig(epochs=2, mini_batch_size=8),  # off-policy second pass: ratios != 1
            loss=LossConfig(entropy_coef=0.01),
            reward=RewardConfig(fn=_parity_reward),
        )
        weights.append({k: v.detach().clone() for k, v in module.policy.state_dict().items()})
        logged.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})
    for name in weights[0]:
        torch.testing.assert_close(weights[0][name], weights[1][name], atol=1e-5, rtol=1e-4)
    assert logged[0]["train/entropy/mean"] == pytest.approx(logged[1]["train/entropy/mean"], rel=1e-5)

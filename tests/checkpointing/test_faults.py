"""Faults and bad states: non-finite loss/gradients skip updates, too many skips stop, engine failures, flat rewards."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rollout import RolloutEngine, SamplingConfig
from lit_entropy.settings import EvaluationConfig, LoggingConfig, LossConfig, OptimConfig, PolicyConfig, UpdateConfig


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class Snapshots(Callback):
    """Policy weights and logged metrics after every batch (index 0 = before training)."""

    def __init__(self) -> None:
        self.weights: list[dict[str, torch.Tensor]] = []
        self.metrics: list[dict[str, float]] = []

    def on_train_start(self, trainer, pl_module) -> None:
        self.weights.append({k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()})

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.weights.append({k: v.detach().clone() for k, v in pl_module.policy.state_dict().items()})
        self.metrics.append({k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")})


def _fit(model_dir, tmp_path, *, batches=3, reward=digit_reward, callbacks=(), **extra):
    seed_everything(0)
    options = dict(
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        optim=OptimConfig(lr=1e-2),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module = RFTModule(PolicyConfig(model_dir), **{**options, **extra})
    module.reward_fn = reward
    snaps = Snapshots()
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=2, num_train_examples=16)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        limit_train_batches=batches,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        callbacks=[snaps, *callbacks],
    )
    return module, trainer, snaps, data


def _poison_loss(module: RFTModule, bad_calls: set[int]) -> list[int]:
    """Make the loss of the listed ``minibatch_loss`` calls (0-based) NaN; returns the call log."""
    calls: list[int] = []
    original = module.minibatch_loss

    def wrapped(*args, **kwargs):
        out = original(*args, **kwargs)
        if len(calls) in bad_calls:
            out.loss = out.loss * float("nan")
        calls.append(len(calls))
        return out

    module.minibatch_loss = wrapped
    return calls


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(a[k], b[k]) for k in a)


def test_a_nan_loss_skips_that_update_with_a_warning_and_a_counter(tiny_model_dir, tmp_path):
    module, trainer, snaps, data = _fit(tiny_model_dir, tmp_path, batches=3)
    _poison_loss(module, bad_calls={1})  # the second batch's only update
    with pytest.warns(UserWarning, match=r"skipped an update with a non-finite loss"):
        trainer.fit(module, data)
    assert module.skipped_updates.total == 1
    assert trainer.global_step == 2  # skipped updates are not optimizer steps
    # Logged from the first skipped update on (before it, the count is 0 and says nothing).
    assert [m.get("train/optim/skipped_updates") for m in snaps.metrics] == [None, 1.0, 1.0]
    w0, w1, w2, w3 = snaps.weights
    assert not _same(w0, w1) and _same(w1, w2) and not _same(w2, w3)  # batch 2 left the weights alone
    assert all(torch.isfinite(v).all() for v in w3.values())
    assert module.skipped_updates.consecutive == 0  # reset by the next good update


def test_a_nan_gradient_with_a_finite_loss_is_skipped(tiny_model_dir, tmp_path):
    module, trainer, snaps, data = _fit(tiny_model_dir, tmp_path, batches=2)

    class PoisonGradOnce(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            if batch_idx == 0:
                weight = pl_module.policy.model.norm.weight
                handle = weight.register_hook(lambda grad: (handle.remove(), grad * float("inf"))[1])

    trainer.callbacks.append(PoisonGradOnce())
    with pytest.warns(UserWarning, match=r"non-finite gradient norm"):
        trainer.fit(module, data)
    assert module.skipped_updates.total == 1 and trainer.global_step == 1
    assert _same(snaps.weights[0], snaps.weights[1]) and not _same(snaps.weights[1], snaps.weights[2])
    norm = snaps.metrics[0]["train/optim/grad_norm"]
    assert math.isnan(norm) or math.isinf(norm)


def test_too_many_consecutive_skips_stop_the_run_and_checkpoints_stay_finite(tiny_model_dir, tmp_path):
    every_step = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1, save_last=True)
    module, trainer, snaps, data = _fit(
        tiny_model_dir, tmp_path, batches=6, update=UpdateConfig(max_consecutive_skips=3), callbacks=[every_step]
    )
    calls = _poison_loss(module, bad_calls={1, 2, 3, 4, 5})  # batch 1 is fine, then NaN forever
    with pytest.warns(UserWarning, match="skipped an update"):
        with pytest.raises(RuntimeError, match=r"3 consecutive updates were skipped.*max_consecutive_skips=3"):
            trainer.fit(module, data)
    assert len(calls) == 4  # 1 good + 3 skipped, then the error
    assert module.skipped_updates.total == 3
    last = torch.load(tmp_path / "ckpt" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 1
    assert all(torch.isfinite(v).all() for v in last["state_dict"].values())
    assert all(torch.isfinite(v).all() for v in module.policy.state_dict().values())


class BrokenEngine(RolloutEngine):
    def generate(self, policy, input_ids, attention_mask, sampling):
        raise ConnectionError("vLLM worker died")


def test_a_rollout_engine_failure_raises_a_clear_error(tiny_model_dir, tmp_path):
    module, trainer, _, data = _fit(tiny_model_dir, tmp_path, rollout=BrokenEngine())
    message = r"rollout engine failed: BrokenEngine.generate raised ConnectionError: vLLM worker died"
    with pytest.raises(RuntimeError, match=message) as err:
        trainer.fit(module, data)
    assert isinstance(err.value.__cause__, ConnectionError)
    assert not (tmp_path / "checkpoints" / "interrupted.ckpt").exists()  # only Ctrl-C writes one


@pytest.mark.parametrize("loss_agg_mode", ["token-mean", "seq-mean-token-mean"])
def test_identical_rewards_in_every_group_are_a_logged_no_op(tiny_model_dir, tmp_path, loss_agg_mode):
    module, trainer, snaps, data = _fit(
        tiny_model_dir,
        tmp_path,
        batches=2,
        reward=lambda c, a: [1.0] * len(c),
        loss=LossConfig(loss_agg_mode=loss_agg_mode),
    )
    trainer.fit(module, data)
    assert module.skipped_updates.total == 0
    for metrics in snaps.metrics:
        assert metrics["train/reward/frac_zero_std"] == 1.0
        assert metrics["train/reward/std"] == 0.0
        assert metrics["train/loss/policy"] == 0.0
        assert metrics["train/optim/grad_norm"] == 0.0
        assert all(math.isfinite(v) for v in metrics.values())
    # zero advantages, no KL / entropy terms, no weight decay: Adam moves nothing
    assert _same(snaps.weights[0], snaps.weights[-1])


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: UpdateConfig(max_consecutive_skips=0),
            r"model.update.max_consecutive_skips must be an integer >= 1, got 0",
        ),
        (lambda: PolicyConfig(fsdp_param_dtype="int8"), r"model.policy.fsdp_param_dtype must be one of .*, got 'int8'"),
    ],
)
def test_fault_options_are_validated(make, message):
    with pytest.raises(ValueError, match=message):
        make()


# ----------------------------------------------------------------------------- a destroyed policy (issue 35 §10)
def test_an_exploding_learning_rate_names_the_update_and_the_learning_rate(tiny_model_dir, tmp_path):
    """lr 1e30: the weights stay finite in float32 but the scores do not; sampling stopped with "rollout engine
    failed ... NaN/+inf scores", which named neither the update nor the learning rate."""
    from lit_entropy.training.health import PolicyDiverged

    module, trainer, snaps, data = _fit(tiny_model_dir, tmp_path, batches=3, optim=OptimConfig(lr=1e30))
    with pytest.warns(UserWarning, match=r"weights exploded: parameter norm .* after the update of step 0"):
        with pytest.raises(PolicyDiverged) as stopped:
            trainer.fit(module, data)
    message = str(stopped.value)
    assert "rollout engine failed" not in message
    assert "because the policy's weights exploded" in message and "model.optim.lr=1e+30" in message


def _peaked_model(model_dir, out) -> str:
    """``model_dir`` with its final norm scaled up: logits 5x larger, so the policy starts at ~0.75 ln V (a
    random-init tiny model samples almost uniformly before any update)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    with torch.no_grad():
        model.model.norm.weight.mul_(5.0)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(model_dir).save_pretrained(out)
    return str(out)


def test_a_policy_collapsed_to_uniform_sampling_is_warned_about(tiny_model_dir, tmp_path):
    """lr 1e4 turns the policy uniform (entropy ln V) within a step or two; the run went on without a word."""
    peaked = _peaked_model(tiny_model_dir, tmp_path / "peaked")
    module, trainer, snaps, data = _fit(peaked, tmp_path, batches=4, optim=OptimConfig(lr=1e4))
    with pytest.warns(UserWarning) as caught:
        trainer.fit(module, data)
    messages = [str(w.message) for w in caught]
    assert any("weights exploded" in m and "model.optim.lr=10000" in m for m in messages), messages
    vocab = module.policy.config.vocab_size
    uniform = [m for m in messages if "the policy samples uniformly" in m]
    assert len(uniform) == 1 and f"maximum ln V = {math.log(vocab):.3f} (vocabulary {vocab})" in uniform[0]
    assert module.trainer is trainer and _health(trainer).start_entropy_fraction < 0.9


def test_a_policy_that_samples_uniformly_from_the_start_is_not_warned_about(tiny_model_dir, tmp_path):
    """A random-init model starts at ~ln V: lr 1e-12 leaves it there, and no update destroyed anything."""
    module, trainer, snaps, data = _fit(tiny_model_dir, tmp_path, batches=2, optim=OptimConfig(lr=1e-12))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(module, data)
    assert not [w for w in caught if "samples uniformly" in str(w.message)]
    assert _health(trainer).start_entropy_fraction >= 0.98


def _health(trainer):
    from lit_entropy.training.health import PolicyHealth

    (health,) = [c for c in trainer.callbacks if isinstance(c, PolicyHealth)]
    return health


def test_non_finite_parameters_stop_the_run_naming_the_parameter_and_the_learning_rate(tiny_model_dir, tmp_path):
    from lit_entropy.training.health import PolicyDiverged

    class PoisonAfterUpdate(Callback):  # before PolicyHealth (the module's callbacks come after the Trainer's)
        def on_train_batch_end(self, trainer, pl_module, *args) -> None:
            with torch.no_grad():
                pl_module.policy.model.norm.weight[0] = float("nan")

    module, trainer, snaps, data = _fit(tiny_model_dir, tmp_path, batches=2, callbacks=[PoisonAfterUpdate()])
    with pytest.raises(
        PolicyDiverged,
        match=r"the update of step 0 made the policy's parameters non-finite "
        r"\(model\.norm\.weight\): the learning rate is too large \(model\.optim\.lr=0\.01\)",
    ):
        trainer.fit(module, data)

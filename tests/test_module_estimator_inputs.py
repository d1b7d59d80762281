"""What an estimator reads besides the rewards, in a fit: ``remax``'s greedy-completion baseline (one greedy rollout
per prompt, decoded again here by an argmax loop) and a reward function's named components (``gdpo``, the weighted
reward, ``train/reward_component/<name>``), each against a reference computed by hand from the recorded rows."""

from __future__ import annotations

import statistics

import pytest
import torch
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.loggers import TensorBoardLogger

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.rewards import RewardFunctionError, compute_reward_scores
from lit_entropy.settings import (
    AdvantageConfig,
    EvaluationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    RewardConfig,
    TrainingSamplingConfig,
)

GROUP, MAX_NEW = 2, 3
# The random-init tiny model starts near ln V: the health check's warning is not what these tests check.
pytestmark = pytest.mark.filterwarnings("ignore:lit_entropy. the policy samples uniformly")


class Recorded(RFTModule):
    """Records every generation (sampling, prompts, rollout, and an argmax decode of the same prompts by the policy
    at that moment) and every experience."""

    generations: list[dict]
    experiences: list

    def generate(self, batch, sampling):
        rollout = super().generate(batch, sampling)
        argmax = _argmax_decode(self.policy, batch, sampling.max_new_tokens, self.eos_token_ids())
        self.generations.append({"sampling": sampling, "rollout": rollout, "argmax": argmax})
        return rollout

    def make_experience(self, rollout, rewards, batch=None):
        experience = super().make_experience(rollout, rewards, batch)
        self.experiences.append((experience, dict(batch)))
        return experience


@torch.no_grad()
def _argmax_decode(policy, batch, max_new_tokens, eos_ids) -> list[list[int]]:
    """Each prompt's greedy completion by a plain loop: unpadded prompt, argmax of the last logits, stop after EOS."""
    out = []
    for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True):
        tokens = ids[mask.bool()].tolist()
        completion: list[int] = []
        for _ in range(max_new_tokens):
            logits = policy(torch.tensor([tokens + completion])).logits[0, -1]
            completion.append(int(logits.argmax()))
            if completion[-1] in eos_ids:
                break
        out.append(completion)
    return out


def _fit(tiny_model_dir, tmp_path, reward_fn, **settings):
    seed_everything(0)
    module = Recorded(
        PolicyConfig(tiny_model_dir),
        sampling=TrainingSamplingConfig(num_samples=GROUP, max_new_tokens=MAX_NEW),
        optim=OptimConfig(lr=1e-3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
        **settings,
    )
    module.generations, module.experiences = [], []
    module.reward_fn = reward_fn
    data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=3, num_train_examples=32)
    trainer = Trainer(
        accelerator="cpu", max_epochs=1, limit_train_batches=2, limit_val_batches=0, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, log_every_n_steps=1,
        logger=TensorBoardLogger(tmp_path, name="run", default_hp_metric=False),
    )  # fmt: skip
    trainer.fit(module, data)
    return module, trainer


def _scalars(trainer) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # reason: test-only reader

    events = EventAccumulator(trainer.logger.log_dir)
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def _decoded(module, rollout) -> list[str]:
    responses = rollout.responses.masked_fill(~rollout.response_mask, module.tokenizer.pad_token_id or 0)
    return module.tokenizer.batch_decode(responses, skip_special_tokens=True)


def _digit_reward(completions, answers):
    """1 for a completion that starts with the answer's first digit, else 0: varied rewards on a random model."""
    return [float(c[:1] == a[:1]) for c, a in zip(completions, answers, strict=True)]


def test_remax_subtracts_the_reward_of_each_prompts_greedy_completion(tiny_model_dir, tmp_path):
    module, trainer = _fit(tiny_model_dir, tmp_path, _digit_reward, advantages=AdvantageConfig(estimator="remax"))
    assert len(module.generations) == 4 and len(module.experiences) == 2  # per step: the samples, then greedy
    greedy_means = []
    for step, (experience, batch) in enumerate(module.experiences):
        sampled, greedy = module.generations[2 * step], module.generations[2 * step + 1]
        assert (sampled["sampling"].temperature, sampled["sampling"].num_samples) == (1.0, GROUP)
        assert (greedy["sampling"].temperature, greedy["sampling"].num_samples) == (0.0, 1)
        assert greedy["sampling"].max_new_tokens == MAX_NEW
        rollout = greedy["rollout"]
        responses = [row[mask].tolist() for row, mask in zip(rollout.responses, rollout.response_mask, strict=True)]
        assert responses == greedy["argmax"]  # the baseline rollout is the policy's argmax decode
        baselines = _digit_reward(_decoded(module, rollout), batch["answers"])
        greedy_means.append(statistics.fmean(baselines))
        rewards = experience.rewards.tolist()
        for row, reward in enumerate(rewards):
            valid = experience.response_mask[row]
            expected = reward - baselines[row // GROUP]
            assert torch.allclose(experience.advantages[row][valid], torch.tensor(expected)), (step, row)
            assert not experience.advantages[row][~valid].any()
    assert _scalars(trainer)["train/reward/greedy"] == pytest.approx(greedy_means)


def _two_components(completions, answers):
    """Named components: the digit match and a length score, to be weighted by model.reward.component_weights."""
    return {
        "digit": [float(c[:1] == a[:1]) for c, a in zip(completions, answers, strict=True)],
        "short": [1.0 / (1 + len(c)) for c in completions],
    }


def test_gdpo_normalises_each_named_reward_component(tiny_model_dir, tmp_path):
    weights = {"short": 0.5}
    module, trainer = _fit(
        tiny_model_dir, tmp_path, _two_components, advantages=AdvantageConfig(estimator="gdpo"),
        reward=RewardConfig(component_weights=weights),
    )  # fmt: skip
    means: dict[str, list[float]] = {"digit": [], "short": []}
    for step, (experience, batch) in enumerate(module.experiences):
        completions = _decoded(module, module.generations[step]["rollout"])
        answers = [a for a in batch["answers"] for _ in range(GROUP)]
        digit = [float(c[:1] == a[:1]) for c, a in zip(completions, answers, strict=True)]
        short = [1.0 / (1 + len(c)) for c in completions]
        means["digit"].append(statistics.fmean(digit))
        means["short"].append(statistics.fmean(short))
        expected_rewards = [d + 0.5 * s for d, s in zip(digit, short, strict=True)]
        assert experience.rewards.tolist() == pytest.approx(expected_rewards, abs=1e-6)
        # GDPO by hand: each component's GRPO advantage in its group, weighted, whitened over the valid tokens
        summed = []
        for row in range(len(completions)):
            start = row - row % GROUP
            total = 0.0
            for weight, part in ((1.0, digit), (0.5, short)):
                group = part[start : start + GROUP]
                total += weight * (part[row] - statistics.fmean(group)) / (statistics.stdev(group) + 1e-6)
            summed.append(total)
        mask = experience.response_mask
        tokens = [summed[row] for row in range(len(summed)) for _ in range(int(mask[row].sum()))]
        mean, std = statistics.fmean(tokens), statistics.stdev(tokens)
        for row in range(len(summed)):
            expected = (summed[row] - mean) / (std**2 + 1e-8) ** 0.5
            assert torch.allclose(experience.advantages[row][mask[row]], torch.tensor(expected), atol=1e-4), row
    scalars = _scalars(trainer)
    for name, values in means.items():
        assert scalars[f"train/reward_component/{name}"] == pytest.approx(values, abs=1e-6)


def test_named_components_are_checked_and_weighted():
    scores = compute_reward_scores(
        lambda c, a: {"a": [1, 0], "b": [0.5, 2.0]}, ["x", "y"], ["x", "y"], fn_name="f", weights={"b": 2.0}
    )
    assert scores.rewards.tolist() == [2.0, 4.0]
    assert {k: v.tolist() for k, v in scores.components.items()} == {"a": [1.0, 0.0], "b": [0.5, 2.0]}
    with pytest.raises(RewardFunctionError, match=r"model.reward.fn: reward function 'f\[b\]' returned 1 rewards"):
        compute_reward_scores(lambda c, a: {"a": [1, 0], "b": [0.5]}, ["x", "y"], ["x", "y"], fn_name="f")
    with pytest.raises(RewardFunctionError, match="must map component names"):
        compute_reward_scores(lambda c, a: {}, ["x"], ["x"], fn_name="f")
    with pytest.raises(ValueError, match=r"model.reward.component_weights must map component names .* got \[1.0\]"):
        RewardConfig(component_weights=[1.0])
    with pytest.raises(ValueError, match="model.reward.component_weights.a"):
        RewardConfig(component_weights={"a": float("nan")})

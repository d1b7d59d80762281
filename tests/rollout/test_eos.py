"""One EOS set for both engines and the trainer: the tokenizer's EOS plus the generation config's EOS ids."""

from __future__ import annotations

import json

import pytest
import torch

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.functional.overlong import truncated_rows
from lit_entropy.models.loading import eos_token_ids, load_tokenizer
from lit_entropy.models.tiny import save_tiny_model
from lit_entropy.module import RFTModule
from lit_entropy.rollout import HFRolloutEngine, RolloutEngine, SamplingConfig, VLLMRolloutEngine
from lit_entropy.settings import PolicyConfig

EOS, SECOND = 1, 9  # the char tokenizer's EOS, and a second id the generation config lists


@pytest.fixture(scope="module")
def two_eos_model(tmp_path_factory):
    path = save_tiny_model(tmp_path_factory.mktemp("two_eos"), build_char_tokenizer())
    config = json.loads((path / "generation_config.json").read_text())
    config["eos_token_id"] = [EOS, SECOND]
    (path / "generation_config.json").write_text(json.dumps(config))
    return str(path)


class _Recording(RolloutEngine):
    reports_logprobs = True

    def attach(self, model_name_or_path, eos_token_id, pad_token_id, seed):
        self.attached = eos_token_id
        return False

    def generate(self, policy, input_ids, attention_mask, sampling):
        raise AssertionError("not called")


def test_the_set_is_the_tokenizers_eos_plus_the_generation_configs(two_eos_model, tiny_model_dir):
    assert load_tokenizer(two_eos_model).eos_token_id == EOS
    assert eos_token_ids(two_eos_model, load_tokenizer(two_eos_model)) == (EOS, SECOND)
    assert eos_token_ids(tiny_model_dir, load_tokenizer(tiny_model_dir)) == (EOS,)  # the same id once


@pytest.mark.parametrize(
    "engine", [HFRolloutEngine(), VLLMRolloutEngine(), _Recording()], ids=lambda e: type(e).__name__
)
def test_every_engine_and_the_trainer_get_the_whole_set(two_eos_model, engine, monkeypatch):
    if isinstance(engine, VLLMRolloutEngine):  # attach would start vLLM: record what it is handed instead
        monkeypatch.setattr(VLLMRolloutEngine, "start", lambda self: None)
    module = RFTModule(PolicyConfig(two_eos_model), rollout=engine)
    module.setup("fit")
    handed = engine.attached if isinstance(engine, _Recording) else engine.eos_token_id
    assert list(handed) == [EOS, SECOND]
    assert module.eos_token_ids() == (EOS, SECOND)
    # A full-length row ending on the generation config's EOS stopped: it is not truncated (mask_truncated keeps it).
    responses = torch.tensor([[5, 6, SECOND], [5, 6, 7]])
    mask = torch.ones(2, 3, dtype=torch.bool)
    assert truncated_rows(responses, mask, max_new_tokens=3, eos_token_ids=module.eos_token_ids()).tolist() == [
        False,
        True,
    ]


def test_the_hf_engine_ends_a_row_on_the_second_eos(two_eos_model):
    from transformers import AutoModelForCausalLM

    engine = HFRolloutEngine()
    engine.attach(two_eos_model, list(eos_token_ids(two_eos_model, load_tokenizer(two_eos_model))), 0, 0)
    model = AutoModelForCausalLM.from_pretrained(two_eos_model)
    bonus = torch.zeros(model.config.vocab_size)
    bonus[SECOND] = 100.0  # make the second EOS the only likely token
    model.lm_head.register_forward_hook(lambda module, args, out: out + bonus)
    prompt = torch.tensor([[5, 6, 7]])
    batch = engine.generate(model, prompt, torch.ones_like(prompt), SamplingConfig(num_samples=2, max_new_tokens=5))
    assert batch.responses[:, 0].tolist() == [SECOND, SECOND]
    assert batch.response_mask.tolist() == [[True]] * 2, "generation stops at the second EOS, which ends the row"

"""SmolLM2-135M-Instruct by name, for real (the smollm2 extra; ``.ci/run`` installs it, elsewhere skipped with the
reason): converted once offline from the package's GGUF into a normal Hugging Face directory whose weights equal
transformers' own dequantization, ChatML prompts that end on ``<|im_end|>``, and ``lit-entropy fit`` / ``validate``
/ ``export`` by the name."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from lit_entropy.models.packaged import PACKAGED_MODELS, resolve_model_path

NAME = "smollm2-135m-instruct"
MODEL = PACKAGED_MODELS[NAME]
HAS_EXTRA = importlib.util.find_spec(MODEL.package) is not None and importlib.util.find_spec("gguf") is not None

pytestmark = [
    pytest.mark.smollm2,
    pytest.mark.skipif(not HAS_EXTRA, reason=f"needs the smollm2 extra: {MODEL.install_command()}"),
]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh cache directory: the first resolution converts, the module's later ones reuse it."""
    root = tmp_path_factory.mktemp("lit_entropy_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LIT_ENTROPY_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def model_dir(cache):
    return Path(resolve_model_path(NAME))


def test_converted_weights_equal_transformers_gguf_dequantization(model_dir):
    from transformers import AutoModelForCausalLM

    from lit_entropy.models.packaged import _locate

    gguf_path, _ = _locate(MODEL, "test")
    reference = AutoModelForCausalLM.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name, dtype=torch.float32)
    converted = AutoModelForCausalLM.from_pretrained(model_dir)  # a plain HF directory: no gguf_file
    assert "quantization_config" not in converted.config.to_dict()
    ours, theirs = converted.state_dict(), reference.state_dict()
    assert sorted(ours) == sorted(theirs)
    assert all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert sum(p.numel() for p in converted.parameters()) == 134_515_008
    ids = torch.tensor([[1, 4093, 198, 1780, 314, 216, 39, 1232, 216, 40, 47, 2]])
    with torch.no_grad():
        torch.testing.assert_close(converted(ids).logits, reference(ids).logits, rtol=0, atol=0)


def test_chat_template_and_eos_come_from_the_package(model_dir):
    from lit_entropy.models.loading import eos_token_ids, load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == end == 2
    assert eos_token_ids(str(model_dir), tokenizer) == (end,)  # the stop set both engines use
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True
    )
    assert text.endswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")


def test_a_greedy_answer_ends_on_im_end_with_the_hf_engine(model_dir):
    from transformers import AutoModelForCausalLM

    from lit_entropy.models.loading import load_tokenizer
    from lit_entropy.rollout import HFRolloutEngine
    from lit_entropy.settings import EvaluationConfig

    tokenizer = load_tokenizer(str(model_dir))
    policy = AutoModelForCausalLM.from_pretrained(model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3? Answer with the number only."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    batch = tokenizer([prompt], return_tensors="pt", add_special_tokens=False)
    engine = HFRolloutEngine()
    engine.attach(str(model_dir), [2], tokenizer.pad_token_id, 0)
    out = engine.generate(
        policy,
        batch["input_ids"],
        batch["attention_mask"],
        EvaluationConfig(num_samples=1, temperature=0, max_new_tokens=24),
    )
    length = int(out.response_mask[0].sum())
    response = out.responses[0, :length].tolist()
    assert response[-1] == 2 and 2 not in response[:-1] and length < 24  # finished, not truncated
    assert "5" in tokenizer.decode(response, skip_special_tokens=True)


def test_fit_validate_and_export_by_name(model_dir, tmp_path, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lit_entropy.cli import cli_main, export_main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["lit-entropy"])
    common = [
        f"--model.policy.model_name_or_path={NAME}",
        "--data.train_dataset=word_problems_1op",
        "--data.val_dataset=word_problems_1op",
        "--data.apply_chat_template=true",
        "--model.reward.fn=word_problem",
        "--data.batch_size=1",
        "--data.val_batch_size=2",
        "--data.num_train_examples=4",
        "--data.num_val_examples=2",
        "--model.sampling.num_samples=2",
        "--model.sampling.max_new_tokens=8",
        "--model.evaluation.num_samples=2",
        "--model.evaluation.max_new_tokens=8",
        "--trainer.accelerator=cpu",
        "--trainer.max_steps=1",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false",
        "--trainer.logger.class_path=lightning.pytorch.loggers.TensorBoardLogger",
        f"--trainer.logger.init_args.save_dir={tmp_path / 'runs'}",
        "--trainer.logger.init_args.name=smollm2",
    ]
    cli_main(["fit", *common])
    run = tmp_path / "runs" / "smollm2" / "version_0"
    checkpoint = run / "checkpoints" / "last.ckpt"
    assert checkpoint.is_file() and (run / "hf_model" / "config.json").is_file()
    cli_main(["validate", *common[:-3], "--trainer.logger=false", f"--ckpt_path={checkpoint}"])
    out = Path(export_main(["--ckpt_path", str(checkpoint), "--out", str(tmp_path / "exported")]))
    exported = AutoModelForCausalLM.from_pretrained(out)  # a normal HF directory: loads without gguf
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.chat_template is not None
    assert exported.generation_config.eos_token_id == 2
    saved = torch.load(checkpoint, map_location="cpu", weights_only=False)["state_dict"]
    policy = {k.removeprefix("policy."): v for k, v in saved.items() if k.startswith("policy.")}
    weights = exported.state_dict()
    assert policy and all(torch.equal(weights[k], v) for k, v in policy.items() if k in weights)
    assert set(weights) - set(policy) <= {"lm_head.weight"}  # tied to the embedding


def test_own_jsonl_of_word_problems_with_the_packaged_model(model_dir, tmp_path):
    """README's "your own word problems" path: a jsonl with question / answer columns, the packaged name as the
    tokenizer, the chat template; no "need the tokenizer" and no "cannot encode" errors."""
    import json

    from lit_entropy.data.datamodule import PromptDataModule

    rows = [{"question": "Ana has 1,200 stamps and buys 5 more. How many now?", "answer": "1205"}] * 3
    data = tmp_path / "mine.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    module = PromptDataModule(
        train_dataset=str(data),
        val_dataset=str(data),
        prompt_key="question",
        answer_key="answer",
        tokenizer_name_or_path=NAME,
        apply_chat_template=True,
        batch_size=3,
    )
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["answers"] == ["1205"] * 3
    assert (
        batch["prompts"][0].startswith("<|im_start|>system\n")
        and "<|im_start|>user\nAna has 1,200" in batch["prompts"][0]
    )

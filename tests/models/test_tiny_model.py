"""The shipped default model: loads offline, vLLM-compatible shape, small, sane tokenizer, mid-band accuracy."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

from lit_entropy.assets import TINY_MODEL_DIR, default_model_path
from lit_entropy.data import ARITHMETIC_ALPHABET, build_char_tokenizer, make_arithmetic_examples


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_model_path(), local_files_only=True)


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    m = AutoModelForCausalLM.from_pretrained(default_model_path(), local_files_only=True)
    return m.eval()


def _true_value(prompt: str) -> int:
    """Independent evaluation of "a<op>b=": scan digits by hand, then apply the operator."""
    a_str, rest = "", prompt.rstrip("=")
    while rest[0].isdigit():
        a_str, rest = a_str + rest[0], rest[1:]
    op, b = rest[0], int(rest[1:])
    return {"+": int(a_str) + b, "-": int(a_str) - b, "*": int(a_str) * b}[op]


def _is_correct(prompt: str, completion: str) -> bool:
    try:
        return int(completion) == _true_value(prompt)
    except ValueError:  # empty or malformed completion
        return False


def test_asset_layout_and_size():
    assert default_model_path() == str(TINY_MODEL_DIR) and TINY_MODEL_DIR.name == "tiny-qwen2-arith"
    files = {p.name for p in TINY_MODEL_DIR.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json"} <= files
    assert sum(p.stat().st_size for p in TINY_MODEL_DIR.iterdir() if p.is_file()) < 10 * 2**20


def test_config_is_vllm_friendly(model, tokenizer):
    cfg = model.config
    assert cfg.model_type == "qwen2"
    assert cfg.head_dim == 64 == cfg.hidden_size // cfg.num_attention_heads
    assert cfg.num_attention_heads % cfg.num_key_value_heads == 0
    assert cfg.vocab_size == len(tokenizer)
    assert (cfg.pad_token_id, cfg.eos_token_id, cfg.bos_token_id) == (
        tokenizer.pad_token_id,
        tokenizer.eos_token_id,
        tokenizer.bos_token_id,
    )
    gen = model.generation_config
    assert (gen.pad_token_id, gen.eos_token_id) == (tokenizer.pad_token_id, tokenizer.eos_token_id)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


def test_tokenizer_ids_and_round_trip(tokenizer):
    assert tokenizer.pad_token == "<pad>" and tokenizer.pad_token_id == 0
    assert (tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token) == ("<eos>", "<bos>", "<unk>")
    assert tokenizer.padding_side == "left"
    # The shipped tokenizer is the one the library builds (same vocabulary, same ids).
    assert tokenizer.get_vocab() == build_char_tokenizer().get_vocab()
    ids = [tokenizer(c)["input_ids"] for c in ARITHMETIC_ALPHABET]
    assert all(len(i) == 1 for i in ids)  # one token per char, no bos/eos added
    assert len({i[0] for i in ids}) == len(ARITHMETIC_ALPHABET)
    assert not {tokenizer.unk_token_id, tokenizer.pad_token_id, tokenizer.eos_token_id} & {i[0] for i in ids}
    texts = [ARITHMETIC_ALPHABET] + [ex["prompt"] + ex["answer"] for ex in make_arithmetic_examples("train", 50)]
    for text in texts:
        enc = tokenizer(text)["input_ids"]
        assert len(enc) == len(text)
        assert tokenizer.decode(enc, skip_special_tokens=True) == text
        assert tokenizer.decode(enc + [tokenizer.eos_token_id, 0], skip_special_tokens=True) == text


@pytest.mark.parametrize("loader", [AutoTokenizer, PreTrainedTokenizerFast])
def test_loaded_tokenizers_encode_one_id_per_char(loader):
    """transformers 5 maps a qwen2 dir's AutoTokenizer to Qwen2Tokenizer (BPE without merges + ByteLevel), not
    the saved WordLevel; on the task alphabet both must give exactly the reference ids (specials, then alphabet)."""
    tok = loader.from_pretrained(default_model_path(), local_files_only=True)
    ref = {c: 4 + i for i, c in enumerate(ARITHMETIC_ALPHABET)}
    texts = [a + b for a in ARITHMETIC_ALPHABET for b in ARITHMETIC_ALPHABET]
    texts += [ex["prompt"] + ex["answer"] for ex in make_arithmetic_examples("validation", 180)]
    assert tok.convert_ids_to_tokens([0, 1, 2, 3]) == ["<pad>", "<eos>", "<bos>", "<unk>"]
    assert (tok.pad_token_id, tok.eos_token_id, tok.padding_side) == (0, 1, "left")
    for text in texts:
        ids = tok(text)["input_ids"]
        assert ids == [ref[c] for c in text], text
        assert tok.decode(ids + [1, 0], skip_special_tokens=True) == text


def _generate(model, tokenizer, prompts, *, do_sample, k=1, seed=0):
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    torch.manual_seed(seed)
    extra = {"temperature": 1.0, "top_k": 0, "top_p": 1.0} if do_sample else {}
    with torch.no_grad():
        out = model.generate(
            **enc,
            do_sample=do_sample,
            num_return_sequences=k,
            max_new_tokens=5,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            **extra,
        )
    return enc, out[:, enc["input_ids"].shape[1] :]


def test_batched_left_padded_sampling_stops_on_eos(model, tokenizer):
    prompts = ["3+4=", "29-17=", "0-29=", "15+15="]  # different lengths -> left padding
    enc, comp = _generate(model, tokenizer, prompts, do_sample=True, k=8)
    assert enc["attention_mask"][:, 0].tolist() == [0, 1, 0, 1] and enc["input_ids"][0, :2].tolist() == [0, 0]
    assert comp.shape[0] == len(prompts) * 8
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    ended = 0
    for row in comp.tolist():
        if eos in row:
            ended += 1
            first = row.index(eos)
            assert first >= 1 and all(t == pad for t in row[first + 1 :])  # nothing after the first eos
    assert ended >= 0.9 * comp.shape[0]  # the model learned to terminate its answers


def test_left_padding_does_not_change_greedy_answers(model, tokenizer):
    prompts = [ex["prompt"] for ex in make_arithmetic_examples("validation", 12, seed=5)]
    _, batched = _generate(model, tokenizer, prompts, do_sample=False)
    batched_text = tokenizer.batch_decode(batched, skip_special_tokens=True)
    for prompt, text in zip(prompts, batched_text, strict=True):
        _, single = _generate(model, tokenizer, [prompt], do_sample=False)
        assert tokenizer.decode(single[0], skip_special_tokens=True) == text


def test_accuracy_is_mid_band(model, tokenizer):
    """Warm-started but deliberately under-trained: GRPO needs some but not all samples right."""
    prompts = [ex["prompt"] for ex in make_arithmetic_examples("validation", 100, seed=0)]
    _, greedy = _generate(model, tokenizer, prompts, do_sample=False)
    greedy_acc = sum(
        _is_correct(p, t)
        for p, t in zip(prompts, tokenizer.batch_decode(greedy, skip_special_tokens=True), strict=True)
    ) / len(prompts)
    k = 4
    _, sampled = _generate(model, tokenizer, prompts, do_sample=True, k=k, seed=0)
    texts = tokenizer.batch_decode(sampled, skip_special_tokens=True)
    hits = [_is_correct(prompts[i // k], t) for i, t in enumerate(texts)]
    sampled_acc = sum(hits) / len(hits)
    mixed = sum(0 < sum(hits[i * k : (i + 1) * k]) < k for i in range(len(prompts))) / len(prompts)
    assert 0.1 <= sampled_acc <= 0.9, sampled_acc
    assert 0.1 <= greedy_acc <= 0.9, greedy_acc
    assert mixed >= 0.3, mixed  # many groups carry reward variance


def test_build_char_tokenizer_custom_alphabet():
    tok = build_char_tokenizer("ab=", model_max_length=16)
    assert tok.model_max_length == 16 and len(tok) == 7
    assert tok("ab=ba")["input_ids"] == [4, 5, 6, 5, 4]
    assert tok("aXb")["input_ids"] == [4, 3, 5]  # unknown char -> <unk> (id 3), not dropped
    batch = tok(["a", "abb"], padding=True)["input_ids"]
    assert batch == [[0, 0, 4], [4, 5, 5]]  # left padding with <pad> = 0
    assert tok.decode([4, 5, 1, 0], skip_special_tokens=True) == "ab"


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"alphabet": ""}, "alphabet"),
        ({"alphabet": "aa"}, "alphabet"),
        ({"alphabet": "a b"}, "alphabet"),
        ({"model_max_length": 0}, "model_max_length"),
    ],
)
def test_build_char_tokenizer_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        build_char_tokenizer(**kwargs)

"""Tests for lit_entropy.data.datamodule.PromptDataModule on small local files and the arithmetic task."""

from __future__ import annotations

import csv
import json
import string
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lit_entropy.data.datamodule import PromptCollator, PromptDataModule

# ---------------------------------------------------------------------- a tiny char tokenizer

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = string.printable  # digits, letters, punctuation, whitespace (newline included)
CHAR_ID = {c: len(SPECIALS) + i for i, c in enumerate(CHARS)}  # independent reference for the ids
PAD_ID = 0
CHAT_TEMPLATE = (
    "{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}[assistant]{% if think is defined and not think %}(no think){% endif %}{% endif %}"
)


def make_tokenizer(*, chat: bool = True, model_max_length: int | None = None) -> PreTrainedTokenizerFast:
    vocab = {tok: i for i, tok in enumerate(SPECIALS)} | CHAR_ID
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    kwargs: dict[str, Any] = {} if model_max_length is None else {"model_max_length": model_max_length}
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>", padding_side="left", **kwargs
    )
    if chat:
        out.chat_template = CHAT_TEMPLATE
    return out


def ids_of(text: str) -> list[int]:
    return [CHAR_ID[c] for c in text]


def expected_batch(texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded ids and mask built by hand from the char table."""
    width = max(len(t) for t in texts)
    ids = [[PAD_ID] * (width - len(t)) + ids_of(t) for t in texts]
    mask = [[0] * (width - len(t)) + [1] * len(t) for t in texts]
    return torch.tensor(ids), torch.tensor(mask)


# ---------------------------------------------------------------------- data files

DAPO_QUESTIONS = ["What is 1+1?", "Compute 6*7.", "Find x if x+2=5, a long question."]
DAPO_ANSWERS = ["2", "42", "3"]


def dapo_rows() -> list[dict[str, Any]]:
    return [
        {
            "data_source": "math_dapo",
            "prompt": [{"role": "user", "content": q}],
            "ability": "MATH",
            "reward_model": {"ground_truth": a, "style": "rule"},
            "extra_info": {"index": f"id-{i}", "split": "default"},
        }
        for i, (q, a) in enumerate(zip(DAPO_QUESTIONS, DAPO_ANSWERS, strict=True))
    ]


AIME_ROWS = [
    {"id": 60, "problem": "Find the sum 2+2.", "solution": "It is 4.", "answer": "4"},
    {"id": 61, "problem": "Find 10-1.", "solution": "Nine.", "answer": "9"},
]


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def dapo_jsonl(tmp_path: Path) -> str:
    return write_jsonl(tmp_path / "dapo.jsonl", dapo_rows())


@pytest.fixture
def dapo_parquet(tmp_path: Path) -> str:
    path = tmp_path / "dapo.parquet"
    pd.DataFrame(dapo_rows()).to_parquet(path)
    return str(path)


@pytest.fixture
def aime_json(tmp_path: Path) -> str:
    path = tmp_path / "aime24.json"
    path.write_text(json.dumps(AIME_ROWS))
    return str(path)


@pytest.fixture
def qa_csv(tmp_path: Path) -> str:
    path = tmp_path / "qa.csv"
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["question", "answer"])
        writer.writerows([["How many legs has a cat?", 4], ["Half of 1?", 0.5], ["Two?", 2]])
    return str(path)


def make_dm(tmp_path: Path, tokenizer: Any = None, **kwargs: Any) -> PromptDataModule:
    kwargs.setdefault("cache_dir", str(tmp_path / "hf_cache"))
    dm = PromptDataModule(**kwargs)
    if tokenizer is not None:
        dm.set_tokenizer(tokenizer)
    return dm


def only_batch(loader: Any) -> dict[str, Any]:
    batches = list(loader)
    assert len(batches) == 1
    return batches[0]


# ---------------------------------------------------------------------- rendering and batches


def test_dapo_jsonl_chat_template_with_system_prompt(tmp_path: Path, dapo_jsonl: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(),
        train_dataset=dapo_jsonl,
        val_dataset=dapo_jsonl,
        answer_key="reward_model.ground_truth",
        apply_chat_template=True,
        system_prompt="Be brief.",
        batch_size=3,
        shuffle=False,
    )
    dm.setup("fit")
    texts = [f"[system]Be brief.\n[user]{q}\n[assistant]" for q in DAPO_QUESTIONS]
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batch = only_batch(loader)
        assert batch["prompts"] == texts
        assert batch["answers"] == DAPO_ANSWERS
        ids, mask = expected_batch(texts)
        assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
        assert torch.equal(batch["input_ids"], ids)
        assert torch.equal(batch["attention_mask"], mask)
    # Left padding: every row ends on its last prompt character; the shorter rows start with pads.
    assert batch["input_ids"][0, 0].item() == PAD_ID and batch["attention_mask"][2].all()


def test_class_key_reaches_the_batch_and_lists_the_validation_classes(tmp_path: Path) -> None:
    rows = [dict(r, data_source=src) for r, src in zip(dapo_rows(), ["b", "a", "b"], strict=True)]
    path = write_jsonl(tmp_path / "classes.jsonl", rows)
    common = dict(train_dataset=path, val_dataset=path, answer_key="reward_model.ground_truth", batch_size=3)
    common.update(apply_chat_template=True, shuffle=False)
    dm = make_dm(tmp_path, make_tokenizer(), class_key="data_source", **common)
    dm.setup("fit")
    assert only_batch(dm.val_dataloader())["classes"] == ["b", "a", "b"]
    assert dm.val_classes() == ["a", "b"]
    plain = make_dm(tmp_path, make_tokenizer(), **common)
    plain.setup("fit")
    assert "classes" not in only_batch(plain.val_dataloader()) and plain.val_classes() is None
    with pytest.raises(ValueError, match=r"class_key='source' is not a column"):
        bad = make_dm(tmp_path, make_tokenizer(), class_key="source", **common)
        bad.setup("fit")


def test_dapo_parquet_train_aime_json_val_with_val_keys(tmp_path: Path, dapo_parquet: str, aime_json: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(),
        train_dataset=dapo_parquet,
        val_dataset=aime_json,
        answer_key="reward_model.ground_truth",
        val_prompt_key="problem",
        val_answer_key="answer",
        apply_chat_template=True,
        prompt_template="{prompt} Put the answer in \\boxed{}.",
        batch_size=3,
        val_batch_size=2,
        shuffle=False,
    )
    dm.setup("fit")
    train = only_batch(dm.train_dataloader())
    # The template applies to string prompts only; DAPO's chat messages pass unchanged.
    assert train["prompts"] == [f"[user]{q}\n[assistant]" for q in DAPO_QUESTIONS]
    assert train["answers"] == DAPO_ANSWERS
    val = only_batch(dm.val_dataloader())
    texts = [f"[user]{r['problem']} Put the answer in \\boxed{{}}.\n[assistant]" for r in AIME_ROWS]
    assert val["prompts"] == texts
    assert val["answers"] == ["4", "9"]
    ids, mask = expected_batch(texts)
    assert torch.equal(val["input_ids"], ids) and torch.equal(val["attention_mask"], mask)


def test_aime_json_plain_text_with_template(tmp_path: Path, aime_json: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(chat=False),
        train_dataset=aime_json,
        val_dataset=None,
        prompt_key="problem",
        prompt_template="Q: {prompt}\nA:",
        batch_size=2,
        shuffle=False,
    )
    dm.setup("fit")
    batch = only_batch(dm.train_dataloader())
    texts = [f"Q: {r['problem']}\nA:" for r in AIME_ROWS]
    assert batch["prompts"] == texts and batch["answers"] == ["4", "9"]
    ids, mask = expected_batch(texts)
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
    assert dm.val_dataloader() == [] and dm.val_data is None


def test_csv_numeric_answers_and_max_samples(tmp_path: Path, qa_csv: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(chat=False),
        train_dataset=qa_csv,
        val_dataset=qa_csv,
        prompt_key="question",
        max_train_samples=2,
        max_val_samples=1,
        batch_size=2,
        shuffle=False,
    )
    dm.setup("fit")
    batch = only_batch(dm.train_dataloader())
    assert batch["prompts"] == ["How many legs has a cat?", "Half of 1?"]
    assert batch["answers"] == ["4", "0.5"]  # numbers become strings
    assert only_batch(dm.val_dataloader())["answers"] == ["4"]


def test_message_list_indexed_without_chat_template(tmp_path: Path, dapo_jsonl: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(chat=False),
        train_dataset=dapo_jsonl,
        val_dataset=None,
        prompt_key="prompt.0.content",
        answer_key="reward_model.ground_truth",
        batch_size=1,
    )
    dm.setup("fit")
    assert dm.train_data is not None
    assert dm.train_data.prompts == DAPO_QUESTIONS
    assert dm.train_data.input_ids == [ids_of(q) for q in DAPO_QUESTIONS]


def test_directory_and_tokenizer_path(tmp_path: Path) -> None:
    data_dir = tmp_path / "aime_dir"
    data_dir.mkdir()
    write_jsonl(data_dir / "part.jsonl", AIME_ROWS)
    tok_dir = tmp_path / "tok"
    make_tokenizer().save_pretrained(tok_dir)
    dm = make_dm(
        tmp_path,
        train_dataset=str(data_dir),
        val_dataset=None,
        prompt_key="problem",
        tokenizer_name_or_path=str(tok_dir),
        apply_chat_template=True,
        batch_size=2,
        shuffle=False,
    )
    assert dm.tokenizer.padding_side == "left" and dm.pad_token_id == PAD_ID
    dm.setup("fit")
    texts = [f"[user]{r['problem']}\n[assistant]" for r in AIME_ROWS]
    batch = only_batch(dm.train_dataloader())
    ids, mask = expected_batch(texts)
    assert torch.equal(batch["input_ids"], ids) and torch.equal(batch["attention_mask"], mask)
    # A save_to_disk directory is read with load_from_disk.
    import datasets

    saved = tmp_path / "saved"
    datasets.DatasetDict({"validation": datasets.Dataset.from_list(AIME_ROWS[::-1])}).save_to_disk(saved)
    dm = make_dm(
        tmp_path,
        make_tokenizer(),
        train_dataset=str(saved),
        train_split="validation",
        val_dataset=None,
        prompt_key="problem",
        batch_size=1,
    )
    dm.setup("fit")
    assert dm.train_data is not None and dm.train_data.answers == ["9", "4"]


def test_hub_name_goes_to_load_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls: list[tuple[str, str | None]] = []

    def fake_load_dataset(path: str, *args: Any, split: str | None = None, **kwargs: Any) -> Any:
        calls.append((path, split))
        if path == "org/offline-dataset":
            raise ConnectionError("no network")
        return datasets.Dataset.from_list(AIME_ROWS)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    dm = make_dm(
        tmp_path,
        make_tokenizer(chat=False),
        train_dataset="math-ai/aime24",
        train_split="test",
        val_dataset=None,
        prompt_key="problem",
        batch_size=1,
    )
    dm.setup("fit")
    assert calls == [("math-ai/aime24", "test")]
    assert dm.train_data is not None and dm.train_data.answers == ["4", "9"]
    dm = make_dm(tmp_path, make_tokenizer(chat=False), train_dataset="org/offline-dataset", val_dataset=None)
    with pytest.raises(ValueError, match=r"train_dataset='org/offline-dataset' is not a local path.*no network"):
        dm.setup("fit")


def test_shuffle_is_seeded_and_drop_last(tmp_path: Path) -> None:
    rows = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]
    path = write_jsonl(tmp_path / "ten.jsonl", rows)

    def epoch_answers(seed: int) -> list[list[str]]:
        tok = make_tokenizer(chat=False)
        dm = make_dm(tmp_path, tok, train_dataset=path, val_dataset=None, batch_size=4, seed=seed)
        loader = dm.train_dataloader()  # runs setup("fit") itself
        return [[a for batch in loader for a in batch["answers"]] for _ in range(2)]

    first, again, other = epoch_answers(0), epoch_answers(0), epoch_answers(1)
    assert first == again  # deterministic from the seed
    assert first != other
    for epoch in first:
        assert len(epoch) == 8 and len(set(epoch)) == 8  # 10 rows, batch 4, drop_last -> 2 full batches
        assert set(epoch) <= {str(i) for i in range(10)}
    assert first[0] != first[1]  # a new order each epoch
    assert first[0] != [str(i) for i in range(8)]


def test_filter_overlong_prompts(tmp_path: Path, dapo_jsonl: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(chat=False),
        train_dataset=dapo_jsonl,
        val_dataset=None,
        prompt_key="prompt.0.content",
        answer_key="reward_model.ground_truth",
        max_prompt_length=13,
        filter_overlong_prompts=True,
        batch_size=1,
    )
    dm.setup("fit")
    assert dm.train_data is not None
    assert dm.train_data.prompts == [q for q in DAPO_QUESTIONS if len(q) <= 13]
    assert dm.train_data.answers == ["2", "42"]


def test_collator_left_pads_by_hand() -> None:
    rows = [
        {"input_ids": [5, 6, 7], "prompt": "a", "answer": "1"},
        {"input_ids": [8], "prompt": "b", "answer": "2"},
        {"input_ids": [], "prompt": "", "answer": "3"},
    ]
    batch = PromptCollator(pad_token_id=9)(rows)
    assert batch["input_ids"].tolist() == [[5, 6, 7], [9, 9, 8], [9, 9, 9]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 0, 0]]
    assert batch["prompts"] == ["a", "b", ""] and batch["answers"] == ["1", "2", "3"]


# ---------------------------------------------------------------------- the arithmetic default


def test_arithmetic_default_with_char_tokenizer(tmp_path: Path) -> None:
    from lit_entropy.data.char_tokenizer import build_char_tokenizer

    dm = PromptDataModule(num_train_examples=64, num_val_examples=16, batch_size=8)
    assert dm.train_dataset == "arithmetic" and dm.val_dataset == "arithmetic"
    dm.setup("fit")  # no tokenizer given: the embedded char tokenizer is used
    assert dm.train_data is not None and dm.val_data is not None
    assert len(dm.train_data) == 64 and len(dm.val_data) == 16
    assert not set(dm.train_data.prompts) & set(dm.val_data.prompts)  # disjoint splits
    reference = build_char_tokenizer()
    vocab = reference.get_vocab()
    batches = list(dm.train_dataloader())
    assert len(batches) == 8
    for batch in batches:
        width = batch["input_ids"].shape[1]
        assert width == max(len(p) for p in batch["prompts"])
        for row, (prompt, answer) in enumerate(zip(batch["prompts"], batch["answers"], strict=True)):
            a, op, b = prompt[:-1].partition("+") if "+" in prompt else prompt[:-1].rpartition("-")
            assert prompt.endswith("=") and op in "+-"
            assert int(answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))
            pad = width - len(prompt)
            expected = [reference.pad_token_id] * pad + [vocab[c] for c in prompt]
            assert batch["input_ids"][row].tolist() == expected
            assert batch["attention_mask"][row].tolist() == [0] * pad + [1] * len(prompt)
    val = list(dm.val_dataloader())
    assert [len(b["answers"]) for b in val] == [8, 8]


def test_arithmetic_too_many_examples_names_the_setting() -> None:
    from lit_entropy.data.arithmetic import arithmetic_split_size

    size = arithmetic_split_size("train", max_operand=9)
    dm = PromptDataModule(num_train_examples=size + 1, arithmetic_options={"max_operand": 9}, val_dataset=None)
    with pytest.raises(ValueError, match=rf"num_train_examples={size + 1}.*max_operand"):
        dm.setup("fit")


def test_fit_with_trainer_without_validation(tmp_path: Path, aime_json: str) -> None:
    import lightning.pytorch as pl

    seen: list[list[str]] = []
    validated: list[list[str]] = []

    class Recorder(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> None:
            assert batch["input_ids"].shape == batch["attention_mask"].shape
            seen.append(batch["answers"])

        def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
            validated.append(batch["answers"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    tok = make_tokenizer(chat=False)
    dm = make_dm(tmp_path, tok, train_dataset=aime_json, val_dataset=None, prompt_key="problem", batch_size=1)
    trainer = pl.Trainer(
        accelerator="cpu",
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Recorder(), datamodule=dm)
    assert sorted(a for batch in seen for a in batch) == ["4", "9"]
    assert validated == []  # val_dataset=None: the empty val_dataloader list skips validation


# ---------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, r"batch_size must be a positive int, got 0"),
        ({"val_batch_size": -1}, r"val_batch_size must be a positive int or None, got -1"),
        ({"max_prompt_length": 0}, r"max_prompt_length must be a positive int or None, got 0"),
        ({"num_train_examples": 0}, r"num_train_examples must be a positive int, got 0"),
        ({"max_val_samples": 0}, r"max_val_samples must be a positive int or None, got 0"),
        ({"num_workers": -2}, r"num_workers must be a non-negative int, got -2"),
        ({"train_dataset": ""}, r"train_dataset must be a non-empty string, got ''"),
        ({"prompt_key": ""}, r"prompt_key must be a non-empty string, got ''"),
        ({"prompt_template": "Solve."}, r"prompt_template must be a string containing '\{prompt\}', got 'Solve.'"),
        ({"system_prompt": "Be brief."}, r"system_prompt='Be brief.' needs apply_chat_template=True"),
        ({"arithmetic_options": [1]}, r"arithmetic_options must be a dict or None, got \[1\]"),
    ],
)
def test_init_errors(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        PromptDataModule(**kwargs)


def test_missing_file_and_unknown_extension(tmp_path: Path, aime_json: str) -> None:
    missing = str(tmp_path / "nope.jsonl")
    # reported at construction: before any tokenizer, model or validation pass
    with pytest.raises(ValueError, match=rf"train_dataset='{missing}' does not exist \(resolved to "):
        make_dm(tmp_path, make_tokenizer(), train_dataset=missing, val_dataset=None)
    with pytest.raises(ValueError, match=rf"val_dataset='{missing}' does not exist"):
        make_dm(
            tmp_path, make_tokenizer(), train_dataset=aime_json, prompt_key="problem", val_dataset=missing, batch_size=1
        )
    text_file = tmp_path / "data.txt"
    text_file.write_text("hello\n")
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset=str(text_file), val_dataset=None)
    with pytest.raises(ValueError, match=rf"train_dataset='{text_file}' has unsupported extension '.txt'"):
        dm.setup("fit")


def test_missing_keys_name_setting_and_columns(tmp_path: Path, dapo_jsonl: str, aime_json: str) -> None:
    tok = make_tokenizer()
    dm = make_dm(tmp_path, tok, train_dataset=aime_json, val_dataset=None, prompt_key="question")
    match = r"prompt_key='question' is not a column of train_dataset='.*aime24\.json' \(available columns: "
    with pytest.raises(ValueError, match=match + r"\['id', 'problem', 'solution', 'answer'\]\)"):
        dm.setup("fit")
    dm = make_dm(tmp_path, tok, train_dataset=dapo_jsonl, val_dataset=None, apply_chat_template=True)
    with pytest.raises(ValueError, match=r"answer_key='answer' is not a column .*'reward_model'"):
        dm.setup("fit")
    dm = make_dm(
        tmp_path, tok, train_dataset=dapo_jsonl, val_dataset=None, apply_chat_template=True, answer_key="reward_model.x"
    )
    with pytest.raises(
        ValueError, match=r"answer_key='reward_model.x': row 0 .* no field 'x' under 'reward_model' .*'ground_truth'"
    ):
        dm.setup("fit")
    dm = make_dm(
        tmp_path,
        tok,
        train_dataset=aime_json,
        prompt_key="problem",
        val_dataset=dapo_jsonl,
        val_answer_key="reward_model.ground_truth",
        val_prompt_key="prompt.3.content",
        batch_size=1,
    )
    with pytest.raises(ValueError, match=r"val_prompt_key='prompt.3.content': row 0 .* list of 1 items, '3'"):
        dm.setup("fit")


def test_bad_field_values(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "odd.jsonl", [{"q": 5, "a": ["x", "y"], "s": "ok"}])
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset=path, val_dataset=None, prompt_key="s", answer_key="a")
    with pytest.raises(ValueError, match=r"answer_key='a': row 0 of train_dataset=.* holds \['x', 'y'\]"):
        dm.setup("fit")
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset=path, val_dataset=None, prompt_key="q", answer_key="s")
    with pytest.raises(ValueError, match=r"prompt_key='q': row 0 .* is neither a string nor a list .* 5"):
        dm.setup("fit")


def test_empty_dataset_and_unknown_split(tmp_path: Path, aime_json: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    empty_csv = tmp_path / "empty.csv"
    empty_csv.write_text("prompt,answer\n")
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset=str(empty_csv), val_dataset=None)
    with pytest.raises(ValueError, match=rf"train_dataset='{empty_csv}': cannot read the csv file"):
        dm.setup("fit")
    dm = make_dm(
        tmp_path,
        make_tokenizer(),
        train_dataset=aime_json,
        val_dataset=aime_json,
        prompt_key="problem",
        batch_size=1,
        val_split="test",
    )
    with pytest.raises(ValueError, match=r"val_split='test' is not a split of val_dataset=.*\(splits: \['train'\]\)"):
        dm.setup("fit")
    # A Hub split without rows (faked: no network here).
    empty = datasets.Dataset.from_dict({"prompt": [], "answer": []})
    monkeypatch.setattr(datasets, "load_dataset", lambda *args, **kwargs: empty)
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset="org/empty", val_dataset=None)
    with pytest.raises(ValueError, match=r"train_dataset='org/empty' \(train_split='train'\) is empty"):
        dm.setup("fit")


def test_batch_size_larger_than_data(tmp_path: Path, aime_json: str) -> None:
    dm = make_dm(tmp_path, make_tokenizer(), train_dataset=aime_json, val_dataset=None, prompt_key="problem")
    with pytest.raises(ValueError, match=r"batch_size=8 exceeds the 2 training prompts of train_dataset='.*': no full"):
        dm.setup("fit")


def test_overlong_prompts(tmp_path: Path, dapo_jsonl: str) -> None:
    common = {
        "train_dataset": dapo_jsonl,
        "val_dataset": None,
        "prompt_key": "prompt.0.content",
        "answer_key": "reward_model.ground_truth",
        "batch_size": 1,
    }
    dm = make_dm(tmp_path, make_tokenizer(), max_prompt_length=11, **common)
    with pytest.raises(
        ValueError, match=r"max_prompt_length=11: the prompt of row 0 of .* has 12 tokens: 'What is 1\+1\?'"
    ):
        dm.setup("fit")
    dm = make_dm(tmp_path, make_tokenizer(model_max_length=20), **common)
    length = len(DAPO_QUESTIONS[2])
    with pytest.raises(ValueError, match=rf"model_max_length=20: the prompt of row 2 of .* has {length} tokens"):
        dm.setup("fit")


def test_chat_template_errors(tmp_path: Path, dapo_jsonl: str) -> None:
    common = {"train_dataset": dapo_jsonl, "val_dataset": None, "answer_key": "reward_model.ground_truth"}
    dm = make_dm(tmp_path, make_tokenizer(chat=False), apply_chat_template=True, **common)
    with pytest.raises(ValueError, match=r"apply_chat_template=True but the tokenizer .* has no chat template"):
        dm.setup("fit")
    dm = make_dm(tmp_path, make_tokenizer(), **common)
    with pytest.raises(ValueError, match=r"prompt_key='prompt' holds chat messages .* apply_chat_template=False"):
        dm.setup("fit")
    rows = [{"prompt": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "answer": "1"}]
    path = write_jsonl(tmp_path / "sys.jsonl", rows)
    dm = make_dm(
        tmp_path, make_tokenizer(), train_dataset=path, val_dataset=None, apply_chat_template=True, system_prompt="X"
    )
    with pytest.raises(ValueError, match=r"system_prompt='X' is set but row 0 .* already starts with a system message"):
        dm.setup("fit")


def test_no_tokenizer_for_files(tmp_path: Path, aime_json: str) -> None:
    dm = make_dm(tmp_path, train_dataset=aime_json, val_dataset=None, prompt_key="problem")
    with pytest.raises(ValueError, match=r"set tokenizer_name_or_path \(got None\) or call set_tokenizer"):
        dm.setup("fit")


def test_chat_template_kwargs_reach_the_template(tmp_path: Path, aime_json: str) -> None:
    dm = make_dm(
        tmp_path,
        make_tokenizer(),
        train_dataset=aime_json,
        val_dataset=None,
        prompt_key="problem",
        apply_chat_template=True,
        chat_template_kwargs={"think": False},
        batch_size=1,
    )
    dm.setup("fit")
    assert dm.train_data is not None
    assert dm.train_data.prompts == [f"[user]{r['problem']}\n[assistant](no think)" for r in AIME_ROWS]
    with pytest.raises(ValueError, match=r"chat_template_kwargs=\{'think': False\} needs apply_chat_template=True"):
        PromptDataModule(chat_template_kwargs={"think": False})


def test_cli_parses_a_dapo_style_config(tmp_path: Path, dapo_parquet: str) -> None:
    from jsonargparse import ArgumentParser

    parser = ArgumentParser()
    parser.add_class_arguments(PromptDataModule, "data")
    config = {
        "data": {
            "train_dataset": dapo_parquet,
            "val_dataset": None,
            "answer_key": "reward_model.ground_truth",
            "apply_chat_template": True,
            "chat_template_kwargs": {"think": True},
            "prompt_template": "{prompt} Put the final answer in \\boxed{}.",
            "batch_size": 3,
            "max_prompt_length": 64,
            "cache_dir": str(tmp_path / "hf_cache"),
        }
    }
    cfg = parser.parse_object(config)
    dm = parser.instantiate(cfg).data
    assert isinstance(dm, PromptDataModule)
    assert dm.prompt_template == "{prompt} Put the final answer in \\boxed{}."
    dm.set_tokenizer(make_tokenizer())
    dm.setup("fit")
    assert sorted(only_batch(dm.train_dataloader())["answers"]) == sorted(DAPO_ANSWERS)

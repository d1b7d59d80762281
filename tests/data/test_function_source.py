"""``data.train_dataset`` / ``val_dataset`` as ``pkg.module:function``: a user's task module, imported from the
working directory, whose rows reach the DataModule unchanged; every mistake in one line naming the setting."""

from __future__ import annotations

import sys
import textwrap

import pytest

from lit_entropy.data.char_tokenizer import build_char_tokenizer
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.data.reading import is_function, load_function

TASK = textwrap.dedent(
    """
    import datasets

    def train_rows():
        return [{"prompt": f"{a}+{a}=", "answer": str(2 * a), "class": ("even", "odd")[a % 2]} for a in range(6)]

    def val_rows():
        return datasets.Dataset.from_list([{"prompt": "9+9=", "answer": "18", "class": "odd"}])

    def broken():
        raise RuntimeError("no rows today")

    def one_dict():
        return {"prompt": "1+1=", "answer": "2"}

    def strings():
        return ["1+1="]

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture
def task_dir(tmp_path, monkeypatch):
    """A user's ``my_task.py`` in the working directory, which is not on ``sys.path`` (as with the console script)."""
    (tmp_path / "my_task.py").write_text(TASK)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", ".", str(tmp_path))])
    monkeypatch.delitem(sys.modules, "my_task", raising=False)
    return tmp_path


def test_is_function_tells_a_function_from_paths_and_hub_names(tmp_path):
    assert is_function("my_task:train_rows") and is_function("pkg.sub.module:make.rows")
    assert not is_function("openai/gsm8k") and not is_function("data/train.jsonl") and not is_function("arithmetic")
    assert not is_function("my_task:") and not is_function(":rows") and not is_function("a:b:c")
    existing = tmp_path / "x:y"
    existing.write_text("{}")
    assert not is_function(str(existing))  # an existing path stays a path


def test_the_rows_reach_the_datamodule_unchanged(task_dir):
    dm = PromptDataModule(
        train_dataset="my_task:train_rows",
        val_dataset="my_task:val_rows",
        class_key="class",
        shuffle=False,
        batch_size=2,
    )
    dm.set_tokenizer(build_char_tokenizer())
    dm.setup("fit")
    train, val = dm.train_data, dm.val_data
    assert list(train.prompts) == [f"{a}+{a}=" for a in range(6)]
    assert list(train.answers) == [str(2 * a) for a in range(6)]
    assert list(train.classes) == ["even", "odd"] * 3
    assert list(val.prompts) == ["9+9="] and list(val.answers) == ["18"]


def test_max_train_samples_applies_to_a_function_source(task_dir):
    dm = PromptDataModule(train_dataset="my_task:train_rows", val_dataset=None, max_train_samples=2, batch_size=2)
    dm.set_tokenizer(build_char_tokenizer())
    dm.setup("fit")
    assert list(dm.train_data.prompts) == ["0+0=", "1+1="]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            "no_such_task:rows",
            r"train_dataset: no module named 'no_such_task', neither on sys.path nor in the working directory",
        ),
        ("my_task:no_rows", r"train_dataset: cannot be imported \(AttributeError: .*no_rows.*got 'my_task:no_rows'"),
        ("my_task:NOT_A_FUNCTION", r"train_dataset='my_task:NOT_A_FUNCTION' is a int, not a function returning rows"),
    ],
)
def test_a_spec_that_does_not_resolve_is_refused_at_construction(task_dir, spec, message):
    with pytest.raises(ValueError, match=message) as err:
        PromptDataModule(train_dataset=spec, val_dataset=None)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("my_task:broken", r"train_dataset='my_task:broken': calling it raised RuntimeError: no rows today"),
        ("my_task:one_dict", r"returned a dict; expected a list of dicts \(one per row\) or a datasets.Dataset"),
        ("my_task:strings", r"train_dataset='my_task:strings': row 0 is a str, not a dict"),
    ],
)
def test_a_function_that_gives_no_rows_is_refused_in_one_line(task_dir, spec, message):
    with pytest.raises(ValueError, match=message) as err:
        load_function("train_dataset", spec)
    assert "\n" not in str(err.value)

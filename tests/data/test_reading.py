"""lit_entropy.data.reading: dotted fields, source lines and encoding errors, against hand-counted files."""

from __future__ import annotations

import datasets
import pytest

from lit_entropy.data.reading import check_utf8, extract_field, is_local, source_line


def test_extract_field_follows_dicts_and_list_indices():
    table = datasets.Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": "a"}], "reward_model": {"ground_truth": "1"}},
            {"prompt": [{"role": "user", "content": "b"}], "reward_model": {"ground_truth": "2"}},
        ]
    )
    assert extract_field(table, "prompt_key", "prompt.0.content", "here") == ["a", "b"]
    assert extract_field(table, "prompt_key", "prompt.-1.role", "here") == ["user", "user"]
    assert extract_field(table, "answer_key", "reward_model.ground_truth", "here") == ["1", "2"]
    with pytest.raises(
        ValueError, match=r"prompt_key='prompt.1.content': row 0 of here: 'prompt' is a list of 1 items"
    ):
        extract_field(table, "prompt_key", "prompt.1.content", "here")
    with pytest.raises(ValueError, match=r"'prompt.0.content' is a str, which has no field 'x'"):
        extract_field(table, "prompt_key", "prompt.0.content.x", "here")
    with pytest.raises(ValueError, match=r"prompt_key='promt' is not a column of here .*did you mean 'prompt'\?"):
        extract_field(table, "prompt_key", "promt", "here")


def test_a_column_with_a_dot_in_its_name_wins():
    table = datasets.Dataset.from_list([{"a.b": "column", "a": {"b": "path"}}])
    assert extract_field(table, "prompt_key", "a.b", "here") == ["column"]


def test_source_line_counts_blank_lines_and_quoted_newlines(tmp_path):
    jsonl = tmp_path / "d.jsonl"
    jsonl.write_text('{"q": 1}\n\n{"q": 2}\n   \n{"q": 3}\n')  # rows on lines 1, 3, 5
    assert [source_line(str(jsonl), row) for row in range(4)] == [1, 3, 5, None]
    csv_file = tmp_path / "d.csv"
    csv_file.write_text('q,a\n"two\nlines",1\nx,2\n')  # header line 1; rows start on lines 2 and 4
    assert [source_line(str(csv_file), row) for row in range(2)] == [2, 4]
    assert source_line(str(tmp_path / "d.parquet"), 0) is None


def test_check_utf8_names_line_column_and_bytes(tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"q": "ok"}\n{"q": "caf\xe9"}\n')
    with pytest.raises(
        ValueError, match=r"train_dataset='x' is not UTF-8 text: line 2, column 11 has the bytes b'\\xe9\"}"
    ):
        check_utf8("train_dataset", "x", path)


def test_is_local_recognises_paths_and_data_files(tmp_path):
    assert is_local(str(tmp_path)) and is_local("./missing") and is_local("data.parquet")
    assert not is_local("BytedTsinghua-SIA/DAPO-Math-17k")

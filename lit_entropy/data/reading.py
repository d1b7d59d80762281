"""Reading prompt sources into ``datasets.Dataset`` tables: the embedded ``"arithmetic"`` task, a Python function
(``pkg.module:function``), local json/jsonl/parquet/csv files or directories, and Hugging Face Hub datasets; plus
reading one (dotted) field of every row.

Every error names the setting (``train_dataset``, ``val_split``, ``prompt_key``, ...) and its value.
"""

from __future__ import annotations

import csv
import difflib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from lit_entropy.data.arithmetic import make_arithmetic_examples
from lit_entropy.data.word_problems import WORD_PROBLEM_TASKS, make_word_problems
from lit_entropy.extensions import import_object

__all__ = [
    "ARITHMETIC_DATASET",
    "BUILDERS",
    "check_utf8",
    "extract_field",
    "is_embedded",
    "is_function",
    "is_local",
    "load_arithmetic",
    "load_function",
    "load_word_problems",
    "load_hub",
    "load_local",
    "load_table",
    "resolve_function",
    "source_line",
]

#: Name of the embedded synthetic task accepted by ``train_dataset`` / ``val_dataset``.
ARITHMETIC_DATASET = "arithmetic"

#: File extension -> ``datasets`` builder name.
BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}


#: ``package.module:function`` (dotted names on both sides of one colon).
FUNCTION_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def is_function(spec: str) -> bool:
    """Whether ``spec`` names a Python function (``pkg.module:function``) rather than an existing path."""
    return FUNCTION_SPEC.fullmatch(spec) is not None and not Path(spec).expanduser().exists()


def resolve_function(setting: str, spec: str) -> Callable[[], Any]:
    """The function ``setting=spec`` names (``pkg.module:function``, imported as a reward function is, from the
    working directory too); a one-line error if it is not one."""
    target = import_object(spec, setting)
    if not callable(target):
        raise ValueError(f"{setting}={spec!r} is a {type(target).__name__}, not a function returning rows")
    return target


def load_function(setting: str, spec: str) -> Any:
    """The rows that the function ``spec`` returns when called without arguments (a list of dicts or a
    ``datasets.Dataset``), as a ``datasets.Dataset``."""
    # deferred: datasets takes ~1 s to import (pyarrow, pandas); only reading a data file needs it
    import datasets

    function = resolve_function(setting, spec)
    try:
        rows = function()
    except Exception as err:  # the user's function failed: name it with its error, on one line
        raise ValueError(f"{setting}={spec!r}: calling it raised {type(err).__name__}: {err}") from None
    if isinstance(rows, datasets.Dataset):
        return rows
    if isinstance(rows, (str, bytes, Mapping)) or not isinstance(rows, (Sequence, Iterator)):
        raise ValueError(
            f"{setting}={spec!r} returned a {type(rows).__name__}; expected a list of dicts (one per row) or a "
            "datasets.Dataset"
        )
    rows = list(rows)
    bad = next((i for i, row in enumerate(rows) if not isinstance(row, Mapping)), None)
    if bad is not None:
        raise ValueError(f"{setting}={spec!r}: row {bad} is a {type(rows[bad]).__name__}, not a dict")
    return datasets.Dataset.from_list([dict(row) for row in rows])


def is_local(spec: str) -> bool:
    """Whether ``spec`` names a local path (existing, path-like, or with a data-file extension)."""
    path = Path(spec).expanduser()
    return path.exists() or spec.startswith(("/", "./", "../", "~")) or path.suffix.lower() in BUILDERS


def load_arithmetic(split: str, count: int, count_setting: str, seed: int, options: Mapping[str, Any]) -> Any:
    """``count`` problems of the embedded task's ``split`` ("train" / "validation") as a ``datasets.Dataset``
    with ``prompt`` / ``answer`` columns; ``options`` are extra ``make_arithmetic_examples`` arguments."""
    # deferred: datasets takes ~1 s to import (pyarrow, pandas); only reading a data file needs it
    import datasets

    try:
        rows = make_arithmetic_examples(split, count, seed=seed, **options)
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"cannot build the arithmetic {split!r} split with {count_setting}={count}, "
            f"arithmetic_options={dict(options)!r}: {err}"
        ) from err
    return datasets.Dataset.from_list(rows)


def load_word_problems(task: str, split: str, count: int, count_setting: str, seed: int) -> Any:
    """``count`` problems of the embedded word-problem ``task`` (``"word_problems"``: 1-3 operations,
    ``"word_problems_1op"``: one, ``"word_problems_easy"``: one addition of small numbers) from ``split`` as a
    ``datasets.Dataset`` with ``prompt`` / ``answer`` / ``operations`` columns (see
    :mod:`lit_entropy.data.word_problems`)."""
    # deferred: datasets takes ~1 s to import (pyarrow, pandas); only reading a data file needs it
    import datasets

    try:
        variant = WORD_PROBLEM_TASKS[task]
        rows = make_word_problems(split, count, seed=seed, operations=variant.operations, easy=variant.easy)
    except ValueError as err:
        raise ValueError(f"cannot build the {task} {split!r} split with {count_setting}={count}: {err}") from err
    return datasets.Dataset.from_list(rows)


def is_embedded(spec: str | None) -> bool:
    """Whether ``spec`` names an embedded generated task (no file, no download)."""
    return spec == ARITHMETIC_DATASET or spec in WORD_PROBLEM_TASKS


def load_table(
    setting: str, spec: str, split_setting: str, split: str, limit: int | None, cache_dir: str | None
) -> Any:
    """The ``datasets.Dataset`` of a function, local or Hub source ``setting=spec``, its first ``limit`` rows (None:
    all). A function source has no splits: ``split_setting`` does not apply to it."""
    if is_function(spec):
        table = load_function(setting, spec)
    elif is_local(spec):
        table = load_local(setting, spec, split_setting, split, cache_dir)
    else:
        table = load_hub(setting, spec, split_setting, split, cache_dir)
    if limit is not None and limit < len(table):
        table = table.select(range(limit))
    if len(table) == 0:
        raise ValueError(f"{setting}={spec!r} ({split_setting}={split!r}) is empty")
    return table


def load_local(setting: str, spec: str, split_setting: str, split: str, cache_dir: str | None) -> Any:
    """Split ``split`` of a local file (one of :data:`BUILDERS`, loaded as split "train"), a directory of data
    files (splits from the file names) or a ``save_to_disk`` directory."""
    # deferred: datasets takes ~1 s to import (pyarrow, pandas); only reading a data file needs it
    import datasets

    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(f"{setting}={spec!r} does not exist")
    if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.Dataset):  # a single saved split
            loaded = datasets.DatasetDict({"train": loaded})
    elif path.is_dir():
        try:
            loaded = datasets.load_dataset(str(path), cache_dir=cache_dir)
        except Exception as err:  # datasets raises several types for unusable directories
            raise ValueError(f"{setting}={spec!r}: cannot load the directory with datasets: {err}") from err
    else:
        builder = BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise ValueError(
                f"{setting}={spec!r} has unsupported extension {path.suffix!r}; expected one of {sorted(BUILDERS)}"
            )
        if builder in ("json", "csv"):
            check_utf8(setting, spec, path)
        try:
            loaded = datasets.load_dataset(builder, data_files=str(path), cache_dir=cache_dir)
        except Exception as err:  # malformed files raise builder-specific errors
            raise ValueError(f"{setting}={spec!r}: cannot read the {builder} file: {err}") from err
    if split not in loaded:
        raise ValueError(f"{split_setting}={split!r} is not a split of {setting}={spec!r} (splits: {list(loaded)})")
    return loaded[split]


def load_hub(setting: str, spec: str, split_setting: str, split: str, cache_dir: str | None) -> Any:
    """Split ``split`` of the Hub dataset ``spec`` (downloaded once into ``cache_dir``)."""
    # deferred: datasets takes ~1 s to import (pyarrow, pandas); only reading a data file needs it
    import datasets

    try:
        return datasets.load_dataset(spec, split=split, cache_dir=cache_dir)
    except Exception as err:  # offline, unknown name, unknown split, ...
        raise ValueError(
            f"{setting}={spec!r} is not a local path and cannot be loaded from the Hugging Face Hub "
            f"({split_setting}={split!r}): {err}"
        ) from err


def check_utf8(setting: str, spec: str, path: Path) -> None:
    """Name the file, line and bytes of the first invalid UTF-8 sequence of a text data file."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{setting}={spec!r} is not UTF-8 text: line {number}, column {err.start + 1} has the bytes "
                    f"{line[err.start : err.end + 3]!r}; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None


def source_line(spec: str, row: int) -> int | None:
    """Line of row ``row`` in a .jsonl / .csv file (blank lines and quoted newlines accounted), else None."""
    path = Path(spec).expanduser()
    suffix = path.suffix.lower()
    if not path.is_file() or suffix not in (".jsonl", ".csv"):
        return None
    with open(path, encoding="utf-8", newline="") as handle:
        if suffix == ".jsonl":
            starts = [number for number, line in enumerate(handle, start=1) if line.strip()]
        else:
            reader = csv.reader(handle)
            starts, previous = [], 0
            for _ in reader:
                starts.append(previous + 1)
                previous = reader.line_num
            starts = starts[1:]  # the header
    return starts[row] if row < len(starts) else None


def extract_field(table: Any, setting: str, key: str, where: str, used: Mapping[str, str] | None = None) -> list[Any]:
    """Values of field ``key`` (a dotted path through dicts and lists) for every row of a ``datasets.Dataset``.

    A column whose own name contains dots wins over the path reading. ``used`` maps the other settings that
    read this table to their keys: a missing column's hint suggests only columns none of them reads.
    """
    columns = table.column_names
    if key in columns:
        return list(table[key])
    head, *rest = key.split(".")
    if head not in columns:
        raise ValueError(
            f"{setting}={key!r} is not a column of {where} (available columns: {columns}){_hint(head, columns, used)}"
        )
    return [_walk(value, setting, key, head, rest, row, where) for row, value in enumerate(table[head])]


def _hint(name: str, columns: list[str], used: Mapping[str, str] | None) -> str:
    """``; did you mean 'x'?`` among the columns no other setting reads (the only such column when none is close)."""
    taken = {column for column in columns for other in (used or {}).values() if _reads(other, column)}
    free = [column for column in columns if column not in taken]
    close = difflib.get_close_matches(name, free, n=1)
    if close:
        return f"; did you mean {close[0]!r}?"
    if len(free) == 1 and taken:
        readers = ", ".join(f"{setting}={key!r}" for setting, key in (used or {}).items() if _reads(key, *taken))
        return f"; did you mean {free[0]!r} (the only column not read by {readers})?"
    return ""


def _reads(key: str, *columns: str) -> bool:
    """Whether the field ``key`` reads one of ``columns`` (the column itself, or a dotted path below it)."""
    return any(key == column or key.startswith(column + ".") for column in columns)


def _walk(value: Any, setting: str, key: str, head: str, rest: list[str], row: int, where: str) -> Any:
    """Follow the dotted path ``rest`` below column ``head`` in one row's ``value``."""
    for depth, part in enumerate(rest):
        at = ".".join([head, *rest[:depth]])
        if isinstance(value, Mapping):
            if part not in value:
                raise ValueError(
                    f"{setting}={key!r}: row {row} of {where} has no field {part!r} under {at!r} "
                    f"(available: {sorted(value)})"
                )
            value = value[part]
        elif isinstance(value, Sequence) and not isinstance(value, str):
            if not part.lstrip("-").isdigit() or not -len(value) <= int(part) < len(value):
                raise ValueError(
                    f"{setting}={key!r}: row {row} of {where}: {at!r} is a list of {len(value)} items, "
                    f"{part!r} is not a valid index"
                )
            value = value[int(part)]
        else:
            raise ValueError(
                f"{setting}={key!r}: row {row} of {where}: {at!r} is a {type(value).__name__}, "
                f"which has no field {part!r}"
            )
    return value

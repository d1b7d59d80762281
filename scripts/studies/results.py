"""The runs of an experiment as one columnar table, ``<experiment dir>/runs.parquet`` (issue 33.2).

A run writes ``per_run/<run>/{eval.csv,train.csv,done.json}`` while it trains (a scratch directory git ignores);
:func:`collect` folds every finished run into the experiment's table, and the analyses read only the table.

One row per CSV row of a run: ``run`` (the run's name, ``<base>__<arm>__s<seed>`` or ``<arm>__s<seed>``),
``code_revision`` (of its ``done.json``), ``record`` (``"eval"`` or ``"train"``: the file it came from), the
CSV's own columns (typed: int, float or string; null where the other record has the column), and ``done`` (the
run's ``done.json`` as JSON text). Each record's column order is kept in the table's metadata, so
:func:`load_runs` gives back the rows as the CSV reader gave them: strings that convert (``float``, ``int``) to the
very values written.

    python -m scripts.studies.results scripts/studies/sod               # fold per_run/ into runs.parquet
    python -m scripts.studies.results scripts/studies/sod --from DIR    # ... the finished runs under DIR/
    python -m scripts.studies.results scripts/studies/sod --to DIR      # the table's runs as run directories
"""

from __future__ import annotations

import argparse
import csv
import fcntl
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "TABLE",
    "collect",
    "finished_runs",
    "is_finished",
    "load_runs",
    "read_run_dir",
    "run_names",
    "run_rows",
    "unfold",
]

#: The table's file name in an experiment's directory.
TABLE = "runs.parquet"
RECORDS = ("eval", "train")


def _typed(values: list[str]) -> list[Any]:
    """A CSV column as ints when every value is one, else floats when every value is one, else the strings."""
    for kind in (int, float):
        try:
            return [kind(v) for v in values]
        except ValueError:
            continue
    return values


def _text(value: Any) -> str:
    """A stored value as the CSV reader would give it (``repr`` round-trips a float exactly)."""
    return repr(value) if isinstance(value, float) else str(value)


def read_run_dir(run_dir: Path) -> dict[str, Any]:
    """``{"eval": rows, "train": rows, "done": dict, "columns": {record: header}}`` of one finished run directory."""
    out: dict[str, Any] = {"done": json.loads((run_dir / "done.json").read_text()), "columns": {}}
    for record in RECORDS:
        with (run_dir / f"{record}.csv").open(newline="") as f:
            reader = csv.DictReader(f)
            out[record] = list(reader)
            out["columns"][record] = list(reader.fieldnames or [])
    return out


def finished_runs(per_run: Path) -> dict[str, Path]:
    """Name -> directory of every run under ``per_run`` with a ``done.json``."""
    return {d.name: d for d in sorted(per_run.glob("*__s*")) if (d / "done.json").exists()}


def _read_table(exp: Path) -> tuple[Any, dict[str, list[str]]]:
    import pyarrow.parquet as pq

    table = pq.read_table(exp / TABLE)
    meta = json.loads((table.schema.metadata or {}).get(b"columns", b"{}"))
    return table, meta


def run_names(exp: Path) -> set[str]:
    """Names of the runs in ``exp``'s table (none when it has no table yet)."""
    if not (exp / TABLE).exists():
        return set()
    import pyarrow.parquet as pq

    return set(pq.read_table(exp / TABLE, columns=["run"]).column("run").to_pylist())


def done_records(exp: Path) -> dict[str, dict[str, Any]]:
    """Run name -> its ``done.json`` record (seconds, code revision, torch, ...) for every run in ``exp``'s table."""
    if not (exp / TABLE).exists():
        return {}
    import pyarrow.parquet as pq

    table = pq.read_table(exp / TABLE, columns=["run", "done"])
    runs, done = table.column("run").to_pylist(), table.column("done").to_pylist()
    return {r: json.loads(d) for r, d in zip(runs, done, strict=True)}


def load_runs(exp: Path) -> dict[str, dict[str, Any]]:
    """Run name -> ``{"eval": rows, "train": rows, "done": dict}`` from ``exp``'s table, rows as ``csv.DictReader``
    gives them (every value a string), in the order they were written."""
    if not (exp / TABLE).exists():
        return {}
    table, columns = _read_table(exp)
    runs: dict[str, dict[str, Any]] = {}
    for row in table.to_pylist():
        run = runs.setdefault(row["run"], {"eval": [], "train": [], "done": json.loads(row["done"])})
        run[row["record"]].append({c: _text(row[c]) for c in columns[row["record"]]})
    return dict(sorted(runs.items()))


def is_finished(exp: Path, name: str) -> bool:
    """Whether run ``name`` of ``exp`` has finished: in the table, or with a ``done.json`` under ``per_run/``."""
    return (exp / "per_run" / name / "done.json").exists() or name in run_names(exp)


def run_rows(exp: Path, name: str, record: str) -> list[dict[str, str]]:
    """The ``record`` rows (``"eval"`` / ``"train"``) of the finished run ``name`` (its directory, else the table)."""
    if (exp / "per_run" / name / "done.json").exists():
        return read_run_dir(exp / "per_run" / name)[record]
    runs = load_runs(exp)
    if name not in runs:
        raise FileNotFoundError(f"run {name} of {exp} has not finished")
    return runs[name][record]


@contextmanager
def _locked(exp: Path) -> Iterator[None]:
    """Several workers finishing at once fold their runs one after the other."""
    exp.mkdir(parents=True, exist_ok=True)
    with (exp / f".{TABLE}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def collect(exp: Path, source: Path | None = None) -> list[str]:
    """Fold the finished runs under ``source`` (default ``exp/per_run``) that the table lacks into ``exp``'s
    table (written atomically); returns their names. A run already in the table is left as it is."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with _locked(exp):
        have = load_runs(exp)
        columns = dict(_read_table(exp)[1]) if have else {}
        new = {n: read_run_dir(d) for n, d in finished_runs(source or exp / "per_run").items() if n not in have}
        if not new:
            return []
        runs = {**have, **new}
        for run in new.values():
            for record in RECORDS:
                if columns.setdefault(record, run["columns"][record]) != run["columns"][record]:
                    raise ValueError(f"{exp}: {record}.csv columns differ between runs: {run['columns'][record]}")
        rows = [
            (name, record, row, json.dumps(run["done"], sort_keys=True))
            for name, run in sorted(runs.items())
            for record in RECORDS
            for row in run[record]
        ]
        names = ["run", "code_revision", "record", *dict.fromkeys(c for r in RECORDS for c in columns[r]), "done"]
        data: dict[str, list[Any]] = {name: [] for name in names}
        for name, record, row, done in rows:
            data["run"].append(name)
            data["code_revision"].append(runs[name]["done"]["code_revision"])
            data["record"].append(record)
            data["done"].append(done)
            for column in names[3:-1]:
                data[column].append(row.get(column))
        arrays = {}
        for column, values in data.items():
            present = [v for v in values if v is not None]
            typed = iter(_typed(present))
            arrays[column] = [next(typed) if v is not None else None for v in values]
        table = pa.table(arrays).replace_schema_metadata({"columns": json.dumps(columns)})
        tmp = exp / f".{TABLE}.tmp"
        pq.write_table(table, tmp, compression="zstd")
        tmp.replace(exp / TABLE)
    return sorted(new)


def unfold(exp: Path, dest: Path) -> list[str]:
    """Write every run of ``exp``'s table that ``dest`` lacks as ``dest/<run>/{eval.csv,train.csv,done.json}``;
    returns their names. Every value converts to the one written (a float column may spell ``-2`` as ``-2.0``).
    A runner pinned at an older commit, which knows finished runs only by their
    ``done.json``, then resumes with the runs committed since (and :func:`collect` with ``source=dest`` folds
    back only the runs the table lacks)."""
    _, columns = _read_table(exp) if (exp / TABLE).exists() else (None, {})
    written = []
    for name, run in load_runs(exp).items():
        d = dest / name
        if (d / "done.json").exists():
            continue
        d.mkdir(parents=True, exist_ok=True)
        for record in RECORDS:
            with (d / f"{record}.csv").open("w", newline="") as f:
                writer = csv.DictWriter(f, fieldnames=columns[record])
                writer.writeheader()
                writer.writerows(run[record])
        (d / "done.json").write_text(json.dumps(run["done"]) + "\n")  # last: the run counts as finished once it exists
        written.append(name)
    return written


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", type=Path, help="the experiment's directory (its table: <dir>/runs.parquet)")
    p.add_argument("--from", dest="source", type=Path, default=None, help="per_run directory (default <dir>/per_run)")
    p.add_argument("--to", dest="dest", type=Path, default=None, help="write the table's runs under this directory")
    args = p.parse_args(argv)
    if args.dest is not None:
        written = unfold(args.experiment, args.dest)
        print(f"{args.dest}: {len(written)} runs written from {args.experiment / TABLE}")
        return
    added = collect(args.experiment, args.source)
    print(f"{args.experiment / TABLE}: {len(added)} runs added, {len(run_names(args.experiment))} in all")


if __name__ == "__main__":
    main()

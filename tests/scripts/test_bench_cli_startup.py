"""scripts/bench/cli_startup.py: the table's medians and ratios against ``import lightning``."""

from __future__ import annotations

from _scripts import load_script


def _bench():
    return load_script("scripts.bench.cli_startup")


def test_the_table_gives_medians_and_ratios_to_import_lightning():
    bench = _bench()
    times = {"import lightning": [3.0, 1.0, 2.0], "lit-entropy --help": [0.1, 0.3, 0.2], "x": [5.0, 4.0, 100.0]}
    rows = bench.table(times).splitlines()[2:]
    assert rows == [
        "| `import lightning` | 2.00 | 1.00x |",
        "| `lit-entropy --help` | 0.20 | 0.10x |",
        "| `x` | 5.00 | 2.50x |",
    ]


def test_every_command_is_timed_once_per_round(monkeypatch):
    bench = _bench()
    calls = []
    monkeypatch.setattr(bench, "time_command", lambda command: calls.append(command[-1]) or 1.0)
    times = bench.measure(rounds=2)
    assert set(times) == set(bench.COMMANDS) and all(values == [1.0, 1.0] for values in times.values())
    assert len(calls) == 3 * len(bench.COMMANDS)  # one warm-up round, then two timed

"""How long ``lit-entropy --help`` and an argument error take, against ``import lightning`` measured in the same run.

Each command runs in a fresh interpreter, interleaved round by round (so load on the machine hits all of them
alike); the table gives the median seconds and the ratio to ``import lightning``:

    python -m scripts.bench.cli_startup --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "import lightning": [sys.executable, "-c", "import lightning"],
    "lit-entropy --help": [sys.executable, "-m", "lit_entropy", "--help"],
    "lit-entropy fit --help": [sys.executable, "-m", "lit_entropy", "fit", "--help"],
    "lit-entropy fit --no_such_flag": [sys.executable, "-m", "lit_entropy", "fit", "--no_such_flag"],
}


def time_command(command: list[str]) -> float:
    """Wall seconds of one run of ``command`` (output discarded; a non-zero exit is expected for the error)."""
    start = time.perf_counter()
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - start


def measure(rounds: int) -> dict[str, list[float]]:
    """``rounds`` interleaved timings of every command (one warm-up round first, not counted)."""
    for command in COMMANDS.values():
        time_command(command)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, command in COMMANDS.items():
            times[name].append(time_command(command))
    return times


def table(times: dict[str, list[float]]) -> str:
    """Markdown table: median seconds and ratio to ``import lightning``."""
    baseline = statistics.median(times["import lightning"])
    lines = ["| command | median s | x import lightning |", "|---|---|---|"]
    for name, values in times.items():
        median = statistics.median(values)
        lines.append(f"| `{name}` | {median:.2f} | {median / baseline:.2f}x |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds (after one warm-up round)")
    args = parser.parse_args(argv)
    print(table(measure(args.rounds)))


if __name__ == "__main__":
    main()

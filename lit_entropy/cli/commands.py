"""``lit-entropy``'s entry point: the answers that need no Lightning, then :mod:`lit_entropy.cli.app`.

``lit-entropy``, ``--help``, ``--version`` and an unknown command answer from here in the time Python starts;
``fit`` / ``validate`` / ``test`` load Lightning and build only their own settings parser, ``export`` loads
the module to read the checkpoint.
"""

from __future__ import annotations

import sys

from lit_entropy import __version__
from lit_entropy.cli.overview import COMMANDS, HELP

__all__ = ["main"]


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``lit-entropy fit|validate|test|export ...``).

    Settings errors and refused actions print one line, ``lit-entropy: error: ...``, and exit with status 2;
    set ``LIT_ENTROPY_TRACEBACK=1`` for the traceback.
    """
    args = sys.argv[1:] if argv is None else list(argv)
    if args[:1] in (["-h"], ["--help"]):
        print(HELP, end="")
        raise SystemExit(0)
    if args[:1] in (["--version"], ["-V"]):
        print(f"lit-entropy {__version__}")
        return
    if not args or (not args[0].startswith("-") and args[0] not in COMMANDS):
        problem = f"unknown command {args[0]!r}" if args else "no command given"
        sys.stderr.write(
            f"{HELP.splitlines()[0]}\nlit-entropy: error: {problem}; choose one of {', '.join(COMMANDS)}\n"
        )
        raise SystemExit(2)
    # deferred: `lit-entropy --help` imports this module alone; the CLI (Lightning, torch) loads for a command
    from lit_entropy.cli.quiet import silence_known_noise, silence_progress_bars

    silence_known_noise()
    silence_progress_bars()
    # deferred: `lit-entropy --help` imports this module alone; the CLI (Lightning, torch) loads for a command
    from lit_entropy.cli.app import main as run

    run(argv)

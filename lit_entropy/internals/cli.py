"""Private state of the command-line libraries (jsonargparse 4.x parsers, LightningCLI 2.6), each in one function.

The one-line settings errors (:mod:`lit_entropy.cli.parse_errors`) need every setting a parser accepts
with its type, and the parser of the running subcommand; ``--help`` lists the registered names of the
registry settings (:func:`append_help`). Pinned by ``tests/internals/test_cli_parsers.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["ParserSetting", "append_help", "parser_settings", "subcommand_parser"]


@dataclass(frozen=True)
class ParserSetting:
    """One argument of a parser: its dotted destination, its option strings and its type (None: untyped)."""

    dest: str
    options: tuple[str, ...]
    typehint: Any


def parser_settings(parser: Any) -> list[ParserSetting]:
    """Every argument of ``parser`` (argparse keeps them in ``_actions``; jsonargparse keeps types in ``_typehint``)."""
    return [
        ParserSetting(action.dest, tuple(action.option_strings), getattr(action, "_typehint", None))
        for action in getattr(parser, "_actions", [])
    ]


def append_help(parser: Any, dest: str, text: str) -> bool:
    """Append ``text`` to the ``--help`` text of ``parser``'s argument ``dest`` (argparse reads ``action.help`` when
    it prints); False when the parser has no such argument."""
    found = False
    for action in getattr(parser, "_actions", []):
        if action.dest == dest:
            action.help = f"{action.help or ''} {text}".strip()
            found = True
    return found


def subcommand_parser(cli: Any, subcommand: str | None) -> Any:
    """The parser LightningCLI built for ``subcommand`` (``fit``, ...); its main parser when there is none."""
    return getattr(cli, "_subcommand_parsers", {}).get(subcommand, cli.parser)

"""Private state of the command-line libraries (jsonargparse 4.x parsers, LightningCLI 2.6), each in one function.

The one-line settings errors (:mod:`lit_entropy.cli.parse_errors`) need every setting a parser accepts
with its type, and the parser of the running subcommand; ``--help`` lists the registered names of the
registry settings (:func:`append_help`); negative numbers in any notation are values (:func:`read_negative_numbers_as`).
Pinned by ``tests/internals/test_cli_parsers.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["ParserSetting", "append_help", "parser_settings", "read_negative_numbers_as", "subcommand_parser"]


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


def read_negative_numbers_as(parser: Any, pattern: re.Pattern[str]) -> None:
    """Make ``parser`` read the words ``pattern`` matches as values, never as options.

    argparse takes a word after an option for a value only when it is not option-like; a word starting with
    ``-`` counts as a value when its private ``_negative_number_matcher`` matches (``-3``, ``-0.5``: no exponent,
    so ``-1e-4`` was read as an unknown option) and the parser has no option that looks like a number.
    """
    parser._negative_number_matcher = pattern

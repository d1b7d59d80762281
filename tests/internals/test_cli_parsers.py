"""Pins lit_entropy.internals.cli against the installed jsonargparse and LightningCLI."""

from __future__ import annotations

from dataclasses import dataclass

import jsonargparse
import lightning
import pytest
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LightningCLI

from lit_entropy.internals.cli import append_help, parser_settings, read_negative_numbers_as, subcommand_parser

VERSIONS = f"jsonargparse {jsonargparse.__version__}, lightning {lightning.__version__}"
UPGRADE = f"({VERSIONS}): update lit_entropy/internals/cli.py"


@dataclass
class Group:
    rate: float = 0.5
    name: str = "x"


def test_parser_settings_lists_each_argument_with_its_type():
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--count", type=int | None, default=None)
    parser.add_argument("--group", type=Group, default=Group())
    settings = {s.dest: s for s in parser_settings(parser)}
    assert settings["count"].options == ("--count",) and settings["count"].typehint == int | None, UPGRADE
    # a dataclass group is flattened into one typed argument per field
    assert settings["group.rate"].typehint is float and settings["group.rate"].options == ("--group.rate",), UPGRADE


def test_append_help_extends_the_printed_help_of_one_argument():
    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--group", type=Group, default=Group())
    assert append_help(parser, "group.name", "Registered: a, b.")
    assert not append_help(parser, "group.missing", "never shown")
    printed = " ".join(parser.format_help().split())
    assert "--group.name NAME Registered: a, b." in printed and "never shown" not in printed, UPGRADE


def test_read_negative_numbers_as_makes_an_exponent_a_value():
    import re

    parser = jsonargparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--lr", type=float, default=1.0)
    with pytest.raises(jsonargparse.ArgumentError):  # argparse's own pattern: -1e-4 looks like an option
        parser.parse_args(["--lr", "-1e-4"])
    read_negative_numbers_as(parser, re.compile(r"^-\d+(\.\d*)?([eE][-+]?\d+)?$"))
    assert parser.parse_args(["--lr", "-1e-4"]).lr == -1e-4, UPGRADE


class _Stop(Exception):
    pass


class _Module(LightningModule):
    def __init__(self, width: int = 3) -> None:
        super().__init__()


def test_subcommand_parser_is_the_one_that_knows_the_subcommands_settings():
    seen: list[LightningCLI] = []

    class Probe(LightningCLI):
        def before_instantiate_classes(self) -> None:
            seen.append(self)
            raise _Stop

    with pytest.raises(_Stop):
        Probe(_Module, args=["validate", "--model.width=4"])
    cli = seen[0]
    parser = subcommand_parser(cli, "validate")
    assert parser is not cli.parser, UPGRADE
    assert {"model.width", "trainer.max_steps"} <= {s.dest for s in parser_settings(parser)}, UPGRADE
    assert subcommand_parser(cli, None) is cli.parser

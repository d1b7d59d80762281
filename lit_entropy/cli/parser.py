"""The argument parser of ``lit-entropy``: no abbreviated options, and every parse error as one line."""

from __future__ import annotations

import os
import re
import sys
from typing import Any, NoReturn

from lightning.pytorch.cli import LightningArgumentParser

from lit_entropy.cli.parse_errors import explain_parse_error
from lit_entropy.internals.cli import read_negative_numbers_as

__all__ = ["NEGATIVE_NUMBER", "RFTArgumentParser"]

#: Words argparse must read as values, not options: ``-1e-4``, ``-.5``, ``-3``, ``-inf``, ``-nan``. argparse's own
#: pattern knows only ``-3`` and ``-0.5``, so ``--model.optim.lr -1e-4`` failed with "expected one argument".
NEGATIVE_NUMBER = re.compile(r"^-(?:(?:\d[\d_]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|inf|infinity|nan)$", re.IGNORECASE)


class RFTArgumentParser(LightningArgumentParser):
    """LightningCLI's parser with abbreviations refused and errors printed as ``lit-entropy: error: <one line>``.

    ``--trainer.max_step=3`` would otherwise be taken for ``--trainer.max_steps``; an unknown option is
    named with the closest real one instead. A negative number in any notation (``-1e-4``) is a value, as
    ``-3`` is for argparse (no option of lit-entropy looks like a number). ``LIT_ENTROPY_TRACEBACK=1`` (or
    ``JSONARGPARSE_DEBUG``) shows jsonargparse's full message.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        read_negative_numbers_as(self, NEGATIVE_NUMBER)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error or os.environ.get("LIT_ENTROPY_TRACEBACK") or os.environ.get("JSONARGPARSE_DEBUG"):
            super().error(message, ex)

        parser = getattr(ex, "subcommand_parser", None) or self
        sys.stderr.write(f"lit-entropy: error: {explain_parse_error(message, parser)}\n")
        self.exit(2)

"""The ``lit-entropy`` command: LightningCLI over :class:`RFTModule` and :class:`PromptDataModule`."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from jsonargparse import set_parsing_settings
from lightning.pytorch.cli import ArgsType, LightningCLI

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule
from lit_entropy.settings import check_legacy_model_keys

# --help documents every setting from its dataclass attribute docstring.
set_parsing_settings(docstring_parse_attribute_docstrings=True)

__all__ = ["RFTCLI", "cli_main", "export_main", "main"]

# RL-friendly defaults: every step is an optimizer update worth logging, and a sanity validation
# pass would spend a full generation round before training starts.
TRAINER_DEFAULTS: dict[str, Any] = {
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        "init_args": {"save_dir": "runs", "name": "lit_entropy", "default_hp_metric": False},
    },
}


class RFTCLI(LightningCLI):
    """LightningCLI with the tokenizer linked from the model and lit_entropy's trainer defaults."""

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The prompts must be tokenized by the policy's own tokenizer.
        parser.link_arguments("model.policy.model_name_or_path", "data.tokenizer_name_or_path")
        parser.add_argument(
            "--val_before_train",
            type=bool,
            default=True,
            help="fit: validate the starting model first, so val/* curves start at step 0 (verl's val_before_train)",
        )

    def parse_arguments(self, parser: Any, args: ArgsType) -> None:
        # Pre-0.2 flat model keys get an error naming their new place, not jsonargparse's generic one.
        try:
            check_legacy_arguments(list(args) if isinstance(args, (list, tuple)) else sys.argv[1:])
        except ValueError as error:
            parser.exit(2, f"lit-entropy: error: {error}\n")
        super().parse_arguments(parser, args)

    def before_fit(self) -> None:
        fit = self.config["fit"]
        # A resumed run validated its starting point already (and the weights are restored only inside fit).
        if fit.get("val_before_train", False) and self.trainer.limit_val_batches != 0 and not fit.get("ckpt_path"):
            self.trainer.validate(self.model, datamodule=self.datamodule)


def check_legacy_arguments(args: list[str]) -> None:
    """Raise a ValueError naming the new key for any pre-0.2 flat ``model.*`` key in ``args`` or their config files."""
    import yaml

    given: dict[str, Any] = {}
    for index, arg in enumerate(args):
        key, _, value = arg.partition("=")
        value = value if value or index + 1 >= len(args) else args[index + 1]
        if key.startswith("--model."):
            given[key.removeprefix("--model.").split(".")[0]] = value
        elif key in ("--config", "-c") and Path(value).is_file():
            model = (yaml.safe_load(Path(value).read_text()) or {}).get("model") or {}
            if isinstance(model, dict):
                check_legacy_model_keys(model.get("init_args", model), value)
    check_legacy_model_keys(given, "the command line")


def cli_main(args: ArgsType = None, run: bool = True) -> RFTCLI:
    """Build (and by default run) the CLI; ``args`` lets tests drive it in-process."""
    return RFTCLI(
        RFTModule,
        PromptDataModule,
        args=args,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        save_config_kwargs={"overwrite": True},
        auto_configure_optimizers=False,
    )


def export_main(args: list[str] | None = None) -> str:
    """``lit-entropy export --ckpt_path CKPT --out DIR``: the checkpoint's policy as a ``save_pretrained`` directory.

    Works on consolidated (single-file) checkpoints; ``fit`` also exports at its end (``model.logging.export_dir``).
    """
    import argparse

    parser = argparse.ArgumentParser(prog="lit-entropy export", description=export_main.__doc__)
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file written by lit-entropy fit")
    parser.add_argument("--out", required=True, help="directory to write (replaced atomically)")
    options = parser.parse_args(args)
    module = RFTModule.load_from_checkpoint(options.ckpt_path, map_location="cpu")
    return module.export_pretrained(options.out)


def main() -> None:
    """Console-script entry point (``lit-entropy fit|validate|test|export ...``)."""
    import sys

    if len(sys.argv) > 1 and sys.argv[1] == "export":
        export_main(sys.argv[2:])
        return
    cli_main()


if __name__ == "__main__":
    main()

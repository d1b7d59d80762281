"""The ``lit-entropy`` command: LightningCLI over :class:`RFTModule` and :class:`PromptDataModule`."""

from __future__ import annotations

from typing import Any

from lightning.pytorch.cli import ArgsType, LightningCLI

from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.module import RFTModule

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
        parser.link_arguments("model.model_name_or_path", "data.tokenizer_name_or_path")
        parser.add_argument(
            "--val_before_train",
            type=bool,
            default=True,
            help="fit: validate the starting model first, so val/* curves start at step 0 (verl's val_before_train)",
        )

    def before_fit(self) -> None:
        fit = self.config["fit"]
        # A resumed run validated its starting point already (and the weights are restored only inside fit).
        if fit.get("val_before_train", False) and self.trainer.limit_val_batches != 0 and not fit.get("ckpt_path"):
            self.trainer.validate(self.model, datamodule=self.datamodule)


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

    Works on consolidated (single-file) checkpoints; ``fit`` also exports at its end (``model.export_dir``).
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

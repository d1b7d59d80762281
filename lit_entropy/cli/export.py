"""``lit-entropy export``: a checkpoint's policy as a Hugging Face ``save_pretrained`` directory."""

from __future__ import annotations

import argparse
from pathlib import Path

from transformers import AutoTokenizer

from lit_entropy.cli.errors import SettingsError
from lit_entropy.cli.quiet import quiet_log_lines
from lit_entropy.models.export import check_export_target, export_hf_model
from lit_entropy.models.packaged import resolve_model_path
from lit_entropy.module import RFTModule

__all__ = ["export_main"]


def export_main(args: list[str] | None = None) -> str:
    """``lit-entropy export --ckpt_path CKPT --out DIR [--merge]``: the checkpoint's policy as a ``save_pretrained``
    directory (a LoRA run's: its peft adapter directory, or with ``--merge`` the merged model).

    Works on consolidated (single-file) checkpoints; ``fit`` also exports at its end (``model.logging.export_dir``).
    A non-empty ``--out`` that is not a previous lit_entropy export is refused unless ``--overwrite``.
    """
    parser = argparse.ArgumentParser(prog="lit-entropy export", description=export_main.__doc__)
    parser.add_argument("--ckpt_path", required=True, help="a .ckpt file written by lit-entropy fit")
    parser.add_argument("--out", required=True, help="directory to write (created, or a previous export)")
    parser.add_argument(
        "--overwrite", action="store_true", help="replace --out even if it holds other files (they are deleted)"
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="LoRA runs: merge the adapters into the base weights and write a plain model (default: the peft "
        "adapter directory)",
    )
    options = parser.parse_args(args)
    check_export_target(options.out, overwrite=options.overwrite)  # before minutes of loading
    ckpt = Path(options.ckpt_path)
    if not ckpt.is_file():
        what = "a directory (a sharded checkpoint: export it from a run instead)" if ckpt.is_dir() else "missing"
        raise SettingsError(f"--ckpt_path={options.ckpt_path!r} is {what}; expected a consolidated .ckpt file")
    with quiet_log_lines("lit_entropy: vocabulary pass"):  # about training compute: nothing to do with exporting
        module = RFTModule.load_from_checkpoint(options.ckpt_path, map_location="cpu")
    tokenizer = module.tokenizer
    if tokenizer is None:  # not set up: the tokenizer of the model the run started from
        tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(module.model_name_or_path))
    path = export_hf_model(module.policy, tokenizer, options.out, overwrite=options.overwrite, merge=options.merge)
    print(f"lit_entropy: exported the policy of {options.ckpt_path} to {path}")
    return str(path)

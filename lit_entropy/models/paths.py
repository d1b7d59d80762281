"""Early, specific errors for model paths, before ``from_pretrained`` turns them into misleading ones.

``AutoModelForCausalLM.from_pretrained`` reports a missing local directory as an invalid Hub repo id, an
empty directory as a missing ``sentencepiece``, and a Git LFS pointer as a corrupt file. :func:`check_model_dir`
names the setting, the path and the fix instead. No transformers import: it only looks at the file system.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from lit_entropy.models.packaged import packaged_names_line

__all__ = ["LFS_POINTER_PREFIX", "MODEL_PATH_SETTING", "check_model_dir", "is_lfs_pointer"]

#: The user-facing setting of the policy's path (the lit-entropy command line / config key).
MODEL_PATH_SETTING = "model.policy.model_name_or_path"
#: First bytes of a Git LFS pointer file (what a clone without ``git lfs`` holds instead of the weights).
LFS_POINTER_PREFIX = b"version https://git-lfs.github.com/spec/"
# A Hub repo id: "name" or "org/name" of letters, digits, "-", "_", "."; no leading "/", "./", "~".
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_LFS_POINTER_MAX_BYTES = 1024


def is_lfs_pointer(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a small text file holding a Git LFS pointer instead of its content."""
    path = Path(path)
    try:
        if not path.is_file() or path.stat().st_size > _LFS_POINTER_MAX_BYTES:
            return False
        with open(path, "rb") as handle:
            return handle.read(len(LFS_POINTER_PREFIX)) == LFS_POINTER_PREFIX
    except OSError:
        return False


def check_model_dir(path: str | os.PathLike, setting: str = MODEL_PATH_SETTING, *, require_weights: bool = True) -> str:
    """Check that ``path`` can be a Hugging Face model directory (or is a Hub repo id); returns it as ``str``.

    Raised for, each naming ``setting`` and the path:

    * a local-looking path (absolute, ``./``, ``~``, or not a valid repo id) that does not exist;
    * a Lightning ``.ckpt`` file (or any file) where a directory is expected;
    * an empty directory, or one without ``config.json`` (``require_weights``) / any tokenizer or config
      file (``require_weights=False``, for a tokenizer);
    * weight or tokenizer files that are Git LFS pointers (cloned without ``git lfs``);
    * with ``require_weights``, a directory without any weights file.

    A name that looks like a Hub repo id and is not a local path is returned unchanged (transformers
    resolves it). Call it before loading: e.g. ``RFTModule.configure_model`` and the datamodule's tokenizer.

    Raises:
        ValueError: Naming the setting, the value and the fix.
    """
    text = os.fspath(path)
    local = Path(text).expanduser()
    where = f"{setting}={text!r}"
    if not local.exists():
        looks_local = text.startswith(("/", "./", "../", "~", ".")) or "\\" in text or not _HUB_ID.match(text)
        if looks_local or local.parent.is_dir() and local.parent != Path("."):
            raise ValueError(
                f"{where} does not exist (resolved to {local.resolve()}); give the directory of a Hugging Face "
                "model (with config.json and weights), a Hub repo id like 'Qwen/Qwen2.5-7B-Instruct' or a packaged "
                f"name: {packaged_names_line()}"
            )
        return text  # a Hub repo id
    if local.is_file():
        raise ValueError(_file_instead_of_directory(text, local, setting))
    _check_contents(local, where, require_weights)
    return text


def _file_instead_of_directory(text: str, local: Path, setting: str) -> str:
    """The error message for a file where a model directory is expected (a Lightning checkpoint above all)."""
    if local.suffix == ".ckpt":
        return (
            f"{setting}={text!r} is a Lightning checkpoint file, not a model directory. To continue that run use "
            f"--ckpt_path {text}; to start from its weights export them first: lit-entropy export "
            f"--ckpt_path {text} --out DIR, then set {setting}=DIR"
        )
    return (
        f"{setting}={text!r} is a file; expected a directory holding a Hugging Face model "
        "(config.json, weights, tokenizer)"
    )


def _check_contents(local: Path, where: str, require_weights: bool) -> None:
    """Refuse an empty directory, Git LFS pointers, and a directory without a model's (or tokenizer's) files."""
    entries = sorted(p.name for p in local.iterdir())
    if not entries:
        raise ValueError(
            f"{where} is an empty directory; download or save a model into it first (e.g. "
            "huggingface-cli download <repo> --local-dir DIR) or point the setting at the right directory"
        )
    pointers = [name for name in entries if is_lfs_pointer(local / name)]
    if pointers:
        raise ValueError(
            f"{where}: {', '.join(pointers)} {'is a Git LFS pointer' if len(pointers) == 1 else 'are Git LFS pointers'}"
            f", not the actual file (the repository was cloned without git-lfs). Run `git lfs install && git lfs "
            f"pull` in {local}, or download it with huggingface-cli download"
        )
    if require_weights:
        if "config.json" not in entries:
            raise ValueError(
                f"{where} has no config.json (found: {_listing(entries)}); it is not a Hugging Face model directory"
            )
        if not any(name.endswith(_WEIGHT_SUFFIXES) for name in entries):
            raise ValueError(
                f"{where} has a config.json but no weights (*.safetensors / *.bin; found: {_listing(entries)})"
            )
    elif not any(name.startswith(("tokenizer", "config", "vocab", "special_tokens")) for name in entries):
        raise ValueError(f"{where} holds no tokenizer files (found: {_listing(entries)})")


def _listing(entries: list[str], limit: int = 6) -> str:
    shown = ", ".join(entries[:limit])
    return shown + (f", ... ({len(entries)} entries)" if len(entries) > limit else "")

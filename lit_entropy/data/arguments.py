"""Argument checks of :class:`~lit_entropy.data.datamodule.PromptDataModule`: every bad value is refused at
construction, naming the argument, the value and what is allowed, before anything is loaded."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lit_entropy.data.reading import ARITHMETIC_DATASET, is_function, is_local, resolve_function

__all__ = ["check_arguments", "check_local_source"]


def _positive_int(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        kind = "a positive int or None" if optional else "a positive int"
        raise ValueError(f"{name} must be {kind}, got {value!r}")


def _non_empty_str(name: str, value: Any, *, optional: bool = False) -> None:
    if optional and value is None:
        return
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty string{' or None' if optional else ''}, got {value!r}")


def check_arguments(args: Mapping[str, Any]) -> None:
    """Refuse bad :class:`PromptDataModule` arguments (``args``: name -> value) before anything is loaded."""
    _non_empty_str("train_dataset", args["train_dataset"])
    _non_empty_str("val_dataset", args["val_dataset"], optional=True)
    for name, value in (("train_split", args["train_split"]), ("val_split", args["val_split"])):
        _non_empty_str(name, value)
    for name, value in (("prompt_key", args["prompt_key"]), ("answer_key", args["answer_key"])):
        _non_empty_str(name, value)
    for name, value in (
        ("val_prompt_key", args["val_prompt_key"]),
        ("val_answer_key", args["val_answer_key"]),
        ("class_key", args["class_key"]),
    ):
        _non_empty_str(name, value, optional=True)
    _non_empty_str("tokenizer_name_or_path", args["tokenizer_name_or_path"], optional=True)
    _non_empty_str("cache_dir", args["cache_dir"], optional=True)
    if not isinstance(args["apply_chat_template"], bool):
        raise ValueError(f"apply_chat_template must be a bool, got {args['apply_chat_template']!r}")
    if args["chat_template_kwargs"] is not None and not isinstance(args["chat_template_kwargs"], Mapping):
        raise ValueError(f"chat_template_kwargs must be a dict or None, got {args['chat_template_kwargs']!r}")
    if args["chat_template_kwargs"] and not args["apply_chat_template"]:
        raise ValueError(f"chat_template_kwargs={args['chat_template_kwargs']!r} needs apply_chat_template=True")
    if args["system_prompt"] is not None and not isinstance(args["system_prompt"], str):
        raise ValueError(f"system_prompt must be a string or None, got {args['system_prompt']!r}")
    if args["system_prompt"] is not None and not args["apply_chat_template"]:
        raise ValueError(
            f"system_prompt={args['system_prompt']!r} needs apply_chat_template=True (a system message only exists "
            "in a chat template); use prompt_template for plain-text prompts"
        )
    if args["prompt_template"] is not None and (
        not isinstance(args["prompt_template"], str) or "{prompt}" not in args["prompt_template"]
    ):
        raise ValueError(f"prompt_template must be a string containing '{{prompt}}', got {args['prompt_template']!r}")
    _positive_int("batch_size", args["batch_size"])
    _positive_int("val_batch_size", args["val_batch_size"], optional=True)
    _positive_int("max_prompt_length", args["max_prompt_length"], optional=True)
    if not isinstance(args["filter_overlong_prompts"], bool):
        raise ValueError(f"filter_overlong_prompts must be a bool, got {args['filter_overlong_prompts']!r}")
    _positive_int("num_train_examples", args["num_train_examples"])
    _positive_int("num_val_examples", args["num_val_examples"])
    _positive_int("max_train_samples", args["max_train_samples"], optional=True)
    _positive_int("max_val_samples", args["max_val_samples"], optional=True)
    if isinstance(args["seed"], bool) or not isinstance(args["seed"], int):
        raise ValueError(f"seed must be an int, got {args['seed']!r}")
    if not isinstance(args["shuffle"], bool):
        raise ValueError(f"shuffle must be a bool, got {args['shuffle']!r}")
    if isinstance(args["num_workers"], bool) or not isinstance(args["num_workers"], int) or args["num_workers"] < 0:
        raise ValueError(f"num_workers must be a non-negative int, got {args['num_workers']!r}")
    if args["arithmetic_options"] is not None and not isinstance(args["arithmetic_options"], Mapping):
        raise ValueError(f"arithmetic_options must be a dict or None, got {args['arithmetic_options']!r}")
    for name, value in (("train_dataset", args["train_dataset"]), ("val_dataset", args["val_dataset"])):
        check_local_source(name, value)


def check_local_source(setting: str, spec: str | None) -> None:
    """At construction: a local data file that is missing or empty, or a ``pkg.module:function`` that does not
    import, is reported before anything loads."""
    if spec is None or spec == ARITHMETIC_DATASET or not isinstance(spec, str):
        return
    if is_function(spec):
        resolve_function(setting, spec)
        return
    if not is_local(spec):
        return
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(
            f"{setting}={spec!r} does not exist (resolved to {path.resolve()}); check the path and the working "
            "directory"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{setting}={spec!r} is an empty file (0 bytes)")

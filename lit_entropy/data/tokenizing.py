"""Tokenizing prompts: which tokenizer the data uses, the pad id, encoding, and the checks on the result
(characters the tokenizer cannot encode, prompts over the length limits)."""

from __future__ import annotations

from typing import Any

from lit_entropy.data.arithmetic import ARITHMETIC_ALPHABET
from lit_entropy.data.reading import ARITHMETIC_DATASET, source_line
from lit_entropy.data.rendering import short

__all__ = ["check_unknown_tokens", "encode_prompts", "load_tokenizer", "pad_token_id", "rows_within_limits"]

# transformers stores "no limit" as int(1e30) in ``model_max_length``; anything this large is not a real context.
_NO_CONTEXT_LIMIT = 10**12


def load_tokenizer(name_or_path: str | None, train_dataset: str, val_dataset: str | None) -> Any:
    """The data's tokenizer: ``AutoTokenizer.from_pretrained(name_or_path)`` (left padding, pad token falling
    back to eos), or the embedded character tokenizer when both sources are the ``"arithmetic"`` task."""
    if name_or_path is not None:
        # deferred: transformers and lit_entropy.models (torch) take seconds; lit_entropy.data imports without them
        from transformers import AutoTokenizer

        from lit_entropy.models.packaged import resolve_model_path
        from lit_entropy.models.paths import MODEL_PATH_SETTING, check_model_dir

        setting = f"tokenizer_name_or_path (lit-entropy: {MODEL_PATH_SETTING})"
        name_or_path = resolve_model_path(name_or_path, setting)
        check_model_dir(name_or_path, setting, require_weights=False)
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, padding_side="left")
        if tokenizer.pad_token is None and tokenizer.eos_token is not None:
            # Common for Llama-style tokenizers; padding is masked out, so any id would do.
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer
    if train_dataset == ARITHMETIC_DATASET and val_dataset in (ARITHMETIC_DATASET, None):
        # deferred: the character tokenizer imports transformers and tokenizers (~2 s)
        from lit_entropy.data.char_tokenizer import build_char_tokenizer

        return build_char_tokenizer()
    # deferred: lit_entropy.models imports torch (~1 s); lit_entropy.data imports without it
    from lit_entropy.models.paths import MODEL_PATH_SETTING

    raise ValueError(
        f"train_dataset={train_dataset!r} / val_dataset={val_dataset!r} need the tokenizer of "
        f"the model being trained: the embedded model's character tokenizer only serves the "
        f"{ARITHMETIC_DATASET!r} task. With lit-entropy set {MODEL_PATH_SETTING} to your model (the data "
        "tokenizer follows it); with PromptDataModule set tokenizer_name_or_path (got None) or call "
        "set_tokenizer()"
    )


def pad_token_id(tokenizer: Any) -> int:
    """Id used for left padding: the tokenizer's pad token, else its eos token."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad is None:
        raise ValueError(f"the tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token")
    return int(pad)


def encode_prompts(tokenizer: Any, prompts: list[str], chat_template: bool) -> list[list[int]]:
    """Token ids of each rendered prompt (unpadded). A chat template already holds the model's special tokens
    (e.g. BOS), so they are not added twice."""
    encoded = tokenizer(prompts, add_special_tokens=not chat_template)["input_ids"]
    return [list(ids) for ids in encoded]


def check_unknown_tokens(
    tokenizer: Any,
    prompts: list[str],
    where: str,
    spec: str,
    tokenizer_name_or_path: str | None,
    prompt_template: str | None,
) -> None:
    """Refuse prompts with characters the tokenizer cannot represent (they would vanish silently).

    A character is unknown when, encoded alone, it gives no token or the unknown token. Byte-level
    tokenizers (Qwen, Llama, GPT-2) encode every character; the embedded character tokenizer drops
    anything outside the arithmetic alphabet. Whitespace is not checked (many tokenizers fold it).
    """
    distinct = sorted({c for prompt in prompts for c in prompt if not c.isspace()})
    if not distinct:
        return
    unk = getattr(tokenizer, "unk_token_id", None)
    encoded = tokenizer(distinct, add_special_tokens=False)["input_ids"]
    chars = {c: None for c, ids in zip(distinct, encoded, strict=True) if not ids or (unk is not None and unk in ids)}
    if not chars:
        return
    bad_rows = [row for row, prompt in enumerate(prompts) if any(c in chars for c in prompt)]
    row = bad_rows[0]
    first = [c for c in dict.fromkeys(prompts[row]) if c in chars]
    line = source_line(spec, row)
    at = f"row {row}" + (f" (line {line} of {spec})" if line is not None else "")
    if tokenizer_name_or_path is None:  # the embedded character tokenizer
        fix = f"the embedded character tokenizer knows only {ARITHMETIC_ALPHABET!r}"
    else:
        # deferred: lit_entropy.models imports torch (~1 s); lit_entropy.data imports without it
        from lit_entropy.models.paths import MODEL_PATH_SETTING

        fix = (
            f"use a model whose tokenizer covers them (tokenizer_name_or_path={tokenizer_name_or_path!r}; "
            f"lit-entropy: {MODEL_PATH_SETTING})"
        )
    in_template = prompt_template is not None and any(c in prompt_template for c in chars)
    template = " (some come from prompt_template)" if in_template else ""
    raise ValueError(
        f"{where}: the tokenizer cannot encode the characters {''.join(chars)!r}{template} ({len(bad_rows)} of "
        f"{len(prompts)} prompts); first at {at}: {first!r} in {short(prompts[row])}. They would become "
        f"<unk> and be dropped when decoded; {fix}"
    )


def rows_within_limits(
    tokenizer: Any,
    input_ids: list[list[int]],
    prompts: list[str],
    where: str,
    max_prompt_length: int | None,
    filter_overlong: bool,
) -> list[int]:
    """Indices of the rows within ``max_prompt_length`` and the tokenizer's ``model_max_length`` (when that is
    a real limit); raises on the first overlong row unless ``filter_overlong``."""
    context = getattr(tokenizer, "model_max_length", None)
    if not (isinstance(context, int) and context < _NO_CONTEXT_LIMIT):
        context = None
    keep = []
    for row, ids in enumerate(input_ids):
        if max_prompt_length is not None and len(ids) > max_prompt_length:
            limit = f"max_prompt_length={max_prompt_length}"
        elif context is not None and len(ids) > context:
            limit = f"the tokenizer's model_max_length={context}"
        else:
            keep.append(row)
            continue
        if not filter_overlong:
            raise ValueError(
                f"{limit}: the prompt of row {row} of {where} has {len(ids)} tokens: {short(prompts[row])} "
                f"(set filter_overlong_prompts=True to drop such rows)"
            )
    return keep

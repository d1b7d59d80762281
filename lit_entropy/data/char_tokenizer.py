"""Character-level tokenizer for the synthetic arithmetic task (one token per character)."""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from lit_entropy.data.arithmetic import ARITHMETIC_ALPHABET

__all__ = ["CHAR_SPECIAL_TOKENS", "build_char_tokenizer"]

#: Special tokens in id order: pad is 0 so zero-filled buffers read as padding.
CHAR_SPECIAL_TOKENS = ("<pad>", "<eos>", "<bos>", "<unk>")


def build_char_tokenizer(
    alphabet: str = ARITHMETIC_ALPHABET, *, model_max_length: int = 64, vocab_size: int | None = None
) -> PreTrainedTokenizerFast:
    """Build a WordLevel tokenizer whose vocabulary is the special tokens then each char of ``alphabet``.

    Ids: ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3, then ``alphabet`` in order. Encoding adds no
    bos/eos (the model must emit ``<eos>`` itself); padding is on the left for batched generation.

    Args:
        alphabet: Distinct characters, none of them whitespace (whitespace would not round-trip).
        model_max_length: Longest sequence (prompt + completion) the model accepts.
        vocab_size: pad the vocabulary with filler tokens ``<f{i}>`` up to this size (benchmarks at a
            realistic vocabulary); None = no filler.
    """
    if not isinstance(alphabet, str) or not alphabet:
        raise ValueError(f"alphabet must be a non-empty string, got {alphabet!r}")
    if len(set(alphabet)) != len(alphabet) or any(c.isspace() for c in alphabet):
        raise ValueError(f"alphabet must hold distinct non-whitespace characters, got {alphabet!r}")
    if isinstance(model_max_length, bool) or not isinstance(model_max_length, int) or model_max_length < 1:
        raise ValueError(f"model_max_length must be a positive int, got {model_max_length!r}")
    vocab = {tok: i for i, tok in enumerate(CHAR_SPECIAL_TOKENS)}
    vocab.update({c: len(CHAR_SPECIAL_TOKENS) + i for i, c in enumerate(alphabet)})
    if vocab_size is not None and vocab_size < len(vocab):
        raise ValueError(f"vocab_size must be >= {len(vocab)} (special tokens + alphabet), got {vocab_size}")
    vocab.update({f"<f{i}>": i for i in range(len(vocab), vocab_size or 0)})
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    # "[\s\S]" isolates every character (newline included) so each one maps to its own id.
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()  # concatenate tokens without separators
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<eos>",
        bos_token="<bos>",
        unk_token="<unk>",
        padding_side="left",
        model_max_length=model_max_length,
    )

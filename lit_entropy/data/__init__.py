"""Datasets and tokenizers."""

from lit_entropy.data.arithmetic import ARITHMETIC_ALPHABET, make_arithmetic_examples
from lit_entropy.data.char_tokenizer import build_char_tokenizer

__all__ = ["ARITHMETIC_ALPHABET", "build_char_tokenizer", "make_arithmetic_examples"]

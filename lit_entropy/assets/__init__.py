"""Models shipped inside the package (loadable offline with ``from_pretrained``)."""

from __future__ import annotations

from pathlib import Path

__all__ = ["TINY_MODEL_DIR", "default_model_path"]

#: Tiny Qwen2 (2 layers, hidden 128, head_dim 64, ~0.3M params) with a char-level tokenizer, warm-started on
#: ``lit_entropy.data.arithmetic`` (operands 0..29, ``+-``) to ~37% sampled (T=1) validation accuracy.
#: Rebuilt deterministically by ``scripts/assets/make_tiny_model.py``; its figures are in ``sft_report.json``.
TINY_MODEL_DIR: Path = Path(__file__).resolve().parent / "tiny-qwen2-arith"


def default_model_path() -> str:
    """Path (str) of the embedded default model directory, for ``AutoModelForCausalLM.from_pretrained``."""
    return str(TINY_MODEL_DIR)

"""Synthetic forking-decision task and a neutral chain-sum task (download-free, seeded).

**Forking task.** A prompt is a key letter, 6 payload digits and ``>``, e.g. ``"f392058>"``. The
response starts with a *strategy* letter (``A``-``D``) that chooses a digit map, then writes the mapped
payload four times, each copy ended by ``.``, e.g. ``"B403169.403169.403169.403169."`` (29 tokens). Only
the first token is a real decision: after it the response is fully determined. Which strategy is right is decided by the
key letter (four keys per strategy, a learnable rule); the classes are long-tailed: strategy ``A`` is
right on 70% of prompts, ``B`` on 20%, ``C`` on 8% and ``D`` on 2% (:data:`CLASS_PROBS`). Exactly one
response is correct per prompt. This is the regime where arXiv 2602.03392's entropy collapse is
harmful: a policy that stops sampling the minority strategies loses pass@K at large K.

**Chain-sum task (neutral control).** A prompt is ``q``, 5 digits and ``=``; the response lists the
running sums mod 10 (``"q35271="`` -> ``"3.8.0.7.8"``). Every token is determined by the prompt, so a
falling entropy there is benign. (Five digits, not eight: the 0.6M-parameter base model did not learn an
8-digit chain within 2000 supervised steps, sampled accuracy 0.0, leaving RL no reward to learn from.)

Splits are disjoint by construction: a payload belongs to ``train``, ``validation`` or ``test`` by a
fixed function of its digits, whatever ``seed`` draws it. Rows carry their ``class`` (the right
strategy; ``"chain"`` for the neutral task) so evaluation can be split by it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path

__all__ = [
    "BASE_STRATEGY_PRIOR",
    "CHAIN_DIGITS",
    "CLASS_PROBS",
    "FORKING_ALPHABET",
    "FORKING_SPLITS",
    "KEYS",
    "PAYLOAD_COPIES",
    "PAYLOAD_DIGITS",
    "STRATEGIES",
    "STUDY_SPLITS",
    "apply_strategy",
    "chain_sum_response",
    "chain_test_rows",
    "chain_train_rows",
    "make_chain_examples",
    "make_forking_examples",
    "reward",
    "short_test_rows",
    "short_train_rows",
    "study_split",
    "split_of_payload",
    "strategy_of_key",
    "test_rows",
    "train_rows",
    "write_splits",
]

#: Strategy letters, most to least often right.
STRATEGIES = "ABCD"
#: Probability that each strategy is the right one on a prompt drawn from the task distribution.
CLASS_PROBS = (0.70, 0.20, 0.08, 0.02)
#: Key letters; ``KEYS[4 * i : 4 * i + 4]`` select strategy ``STRATEGIES[i]``.
KEYS = "abcdefghijklmnop"
#: Strategy prior the base models are warm-started with, whatever the key (the skewed "~75/25" prior).
BASE_STRATEGY_PRIOR = (0.75, 0.15, 0.07, 0.03)
#: Payload digits of a forking prompt.
PAYLOAD_DIGITS = 6
#: Copies of the mapped payload in a response (1 strategy token + 4 x 7 = 29 tokens).
PAYLOAD_COPIES = 4
#: Digits of a chain-sum prompt.
CHAIN_DIGITS = 5
#: Every character of either task.
FORKING_ALPHABET = "0123456789" + KEYS + STRATEGIES + "q>.="
FORKING_SPLITS = ("train", "validation", "test")

# Digit map of each strategy: A copies, B adds 1, C adds 5, D takes 9 - d (all mod 10).
_DIGIT_MAPS = {
    "A": lambda d: d,
    "B": lambda d: (d + 1) % 10,
    "C": lambda d: (d + 5) % 10,
    "D": lambda d: 9 - d,
}


def strategy_of_key(key: str) -> str:
    """The strategy that is right for a prompt with this key letter."""
    if len(key) != 1 or key not in KEYS:
        raise ValueError(f"key must be one of {KEYS!r}, got {key!r}")
    return STRATEGIES[KEYS.index(key) // 4]


def apply_strategy(strategy: str, payload: str, copies: int = PAYLOAD_COPIES) -> str:
    """Response text of ``strategy`` on ``payload`` digits: the letter, then the mapped digits ``copies`` times
    (default :data:`PAYLOAD_COPIES`), each copy ended by ``.`` (copies at a fixed offset: easy for a tiny model,
    near-deterministic; ``copies=1`` is issue 24's short-execution variant, 8 tokens)."""
    if strategy not in _DIGIT_MAPS:
        raise ValueError(f"strategy must be one of {STRATEGIES!r}, got {strategy!r}")
    if not payload.isdigit():
        raise ValueError(f"payload must be a non-empty digit string, got {payload!r}")
    if isinstance(copies, bool) or not isinstance(copies, int) or copies < 1:
        raise ValueError(f"copies must be a positive int, got {copies!r}")
    mapped = "".join(str(_DIGIT_MAPS[strategy](int(d))) for d in payload)
    return strategy + (mapped + ".") * copies


def split_of_payload(payload: str) -> str:
    """Split a payload belongs to (fixed, seed-independent): digit sum weighted by position, mod 10."""
    h = sum((i + 1) * int(d) for i, d in enumerate(payload)) % 10
    return "test" if h == 9 else "validation" if h == 8 else "train"


def _check_split(split: str, n: int) -> None:
    if split not in FORKING_SPLITS:
        raise ValueError(f"split must be one of {FORKING_SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive int, got {n!r}")


def _draw_payload(rng: random.Random, split: str, digits: int, seen: set[str]) -> str:
    while True:
        payload = "".join(rng.choice("0123456789") for _ in range(digits))
        if payload not in seen and split_of_payload(payload) == split:
            seen.add(payload)
            return payload


def make_forking_examples(
    split: str,
    n: int,
    seed: int = 0,
    *,
    class_counts: Sequence[int] | None = None,
    strategy_prior: Sequence[float] | None = None,
    payload_copies: int = PAYLOAD_COPIES,
) -> list[dict[str, str]]:
    """``n`` rows ``{"prompt", "answer", "class"}`` of the forking task; distinct payloads within a call.

    Args:
        split: ``"train"``, ``"validation"`` or ``"test"`` (disjoint payload sets).
        n: Number of rows (ignored when ``class_counts`` is given).
        seed: Seeds the draw.
        class_counts: Rows per class in ``STRATEGIES`` order (a stratified split, e.g. for test); None draws
            classes from :data:`CLASS_PROBS`.
        strategy_prior: When given, ``answer`` is the response of a strategy drawn from this prior *whatever
            the key* (supervised warm-start data of the base models); ``class`` stays the right strategy.
        payload_copies: Copies of the mapped payload in a response (:func:`apply_strategy`); the prompts do not
            depend on it.
    """
    if class_counts is not None:
        if len(class_counts) != len(STRATEGIES) or any(int(c) < 0 for c in class_counts) or sum(class_counts) < 1:
            raise ValueError(f"class_counts must be {len(STRATEGIES)} non-negative ints, got {class_counts!r}")
        n = int(sum(class_counts))
    _check_split(split, n)
    rng = random.Random(f"forking/{split}/{seed}")
    if class_counts is not None:
        classes = [s for s, c in zip(STRATEGIES, class_counts, strict=True) for _ in range(int(c))]
    else:
        classes = rng.choices(STRATEGIES, weights=CLASS_PROBS, k=n)
    seen: set[str] = set()
    rows = []
    for cls in classes:
        key = rng.choice(KEYS[4 * STRATEGIES.index(cls) : 4 * STRATEGIES.index(cls) + 4])
        payload = _draw_payload(rng, split, PAYLOAD_DIGITS, seen)
        chosen = rng.choices(STRATEGIES, weights=strategy_prior, k=1)[0] if strategy_prior else cls
        rows.append(
            {"prompt": f"{key}{payload}>", "answer": apply_strategy(chosen, payload, payload_copies), "class": cls}
        )
    return rows


def chain_sum_response(digits: str) -> str:
    """Running sums mod 10 of ``digits``, joined by ``.`` (the unique correct chain-sum response)."""
    if not digits.isdigit():
        raise ValueError(f"digits must be a non-empty digit string, got {digits!r}")
    total, out = 0, []
    for d in digits:
        total = (total + int(d)) % 10
        out.append(str(total))
    return ".".join(out)


def make_chain_examples(split: str, n: int, seed: int = 0) -> list[dict[str, str]]:
    """``n`` rows ``{"prompt", "answer", "class": "chain"}`` of the neutral chain-sum task."""
    _check_split(split, n)
    rng = random.Random(f"chain/{split}/{seed}")
    seen: set[str] = set()
    rows = []
    for _ in range(n):
        digits = _draw_payload(rng, split, CHAIN_DIGITS, seen)
        rows.append({"prompt": f"q{digits}=", "answer": chain_sum_response(digits), "class": "chain"})
    return rows


#: The studies' RL data (seed 0): the train split drawn from the task distribution (70/20/8/2), validation and test
#: stratified so that every class has enough prompts for per-class pass@k; the chain task's split sizes.
STUDY_SPLITS = {
    "train": {"n": 4096},
    "validation": {"class_counts": (16, 16, 16, 16)},
    "test": {"class_counts": (16,) * 4},
}
CHAIN_SPLITS = {"train": 4096, "validation": 64, "test": 64}


def study_split(split: str, payload_copies: int = PAYLOAD_COPIES) -> list[dict[str, str]]:
    """The studies' rows of ``split`` (:data:`STUDY_SPLITS`), with ``payload_copies`` copies per response."""
    spec = STUDY_SPLITS[split]
    return make_forking_examples(
        split, spec.get("n", 1), seed=0, class_counts=spec.get("class_counts"), payload_copies=payload_copies
    )


def train_rows() -> list[dict[str, str]]:
    """The forking studies' training prompts (``data.train_dataset: scripts.studies.tasks.forking:train_rows``)."""
    return study_split("train")


def test_rows() -> list[dict[str, str]]:
    """The forking studies' test prompts (16 per class), on which they evaluate."""
    return study_split("test")


def short_train_rows() -> list[dict[str, str]]:
    """Training prompts of the short-execution variant (one copy of the payload per response, issue 24 B)."""
    return study_split("train", payload_copies=1)


def short_test_rows() -> list[dict[str, str]]:
    """Test prompts of the short-execution variant."""
    return study_split("test", payload_copies=1)


def chain_train_rows() -> list[dict[str, str]]:
    """Training prompts of the neutral chain-sum task."""
    return make_chain_examples("train", CHAIN_SPLITS["train"], seed=0)


def chain_test_rows() -> list[dict[str, str]]:
    """Test prompts of the neutral chain-sum task."""
    return make_chain_examples("test", CHAIN_SPLITS["test"], seed=0)


def reward(completions: list[str], answers: list[str]) -> list[float]:
    """1.0 where the completion equals the (unique) correct response, else 0.0; for both tasks.

    Importable as ``model.reward.fn: scripts.studies.tasks.forking:reward``.
    """
    if len(completions) != len(answers):
        raise ValueError(f"completions and answers must have equal lengths, got {len(completions)}, {len(answers)}")
    return [float(c.strip() == a.strip()) for c, a in zip(completions, answers, strict=True)]


def write_splits(out_dir: str | Path, rows_by_split: dict[str, list[dict[str, str]]]) -> dict[str, Path]:
    """Write ``<out_dir>/<split>.jsonl`` (columns prompt, answer, class) for ``PromptDataModule``; returns paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, rows in rows_by_split.items():
        path = out / f"{split}.jsonl"
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))
        tmp.replace(path)
        paths[split] = path
    return paths

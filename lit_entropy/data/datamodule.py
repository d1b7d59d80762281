"""Prompt data for RL fine-tuning: ``(prompt, answer)`` pairs, tokenized once, served as left-padded batches.

The LightningModule samples the completions itself, so a batch carries only prompts (and the ground-truth
answers its reward function needs). Sources are the embedded synthetic ``"arithmetic"`` task, local
json/jsonl/parquet/csv files or directories, and Hugging Face Hub datasets.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch import Tensor
from torch.utils.data import DataLoader, Dataset

from lit_entropy.data.sampler import ResumableDataLoader, ResumableDistributedSampler

__all__ = ["ARITHMETIC_DATASET", "PromptCollator", "PromptDataModule", "PromptDataset"]

#: Name of the embedded synthetic task accepted by ``train_dataset`` / ``val_dataset``.
ARITHMETIC_DATASET = "arithmetic"

# File extension -> ``datasets`` builder name.
_BUILDERS = {".json": "json", ".jsonl": "json", ".parquet": "parquet", ".csv": "csv"}
# transformers stores "no limit" as int(1e30) in ``model_max_length``; anything this large is not a real context.
_NO_CONTEXT_LIMIT = 10**12
# Characters of a prompt quoted in error messages.
_SNIPPET = 80


class PromptDataset(Dataset):
    """Map-style dataset of tokenized prompts (map-style so Lightning injects a ``DistributedSampler``).

    Args:
        input_ids: Token ids of each rendered prompt (unpadded).
        prompts: Rendered prompt text (after template / chat template), one per row.
        answers: Ground-truth answer string, one per row.
        classes: Class (or source) name of each row, for per-class validation metrics; None = no classes.
    """

    def __init__(
        self, input_ids: list[list[int]], prompts: list[str], answers: list[str], classes: list[str] | None = None
    ) -> None:
        if not len(input_ids) == len(prompts) == len(answers) == len(answers if classes is None else classes):
            raise ValueError(
                f"input_ids, prompts, answers (and classes) must have equal lengths, got "
                f"{len(input_ids)}, {len(prompts)}, {len(answers)}" + ("" if classes is None else f", {len(classes)}")
            )
        self.input_ids = input_ids
        self.prompts = prompts
        self.answers = answers
        self.classes = classes

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict[str, Any]:
        row = {"input_ids": self.input_ids[index], "prompt": self.prompts[index], "answer": self.answers[index]}
        if self.classes is not None:
            row["class"] = self.classes[index]
        return row


class PromptCollator:
    """Collate :class:`PromptDataset` rows into a left-padded batch (a class, so it pickles for workers).

    Returns a dict with ``input_ids`` ``[B, L]`` (int64, left-padded with ``pad_token_id``),
    ``attention_mask`` ``[B, L]`` (int64, 1 on real tokens), ``prompts`` (list of B str) and ``answers``
    (list of B str), plus ``classes`` (list of B str) when the rows have a ``class``; ``L`` is the longest
    prompt of the batch. Left padding keeps every prompt's last
    token in the last column, which batched decoder-only generation needs.

    Args:
        pad_token_id: Id written into the padding positions.
    """

    def __init__(self, pad_token_id: int) -> None:
        if isinstance(pad_token_id, bool) or not isinstance(pad_token_id, int):
            raise ValueError(f"pad_token_id must be an int, got {pad_token_id!r}")
        self.pad_token_id = pad_token_id

    def __call__(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Tensor | list[str]]:
        if not rows:
            raise ValueError("rows must be a non-empty sequence, got an empty one")
        width = max(len(row["input_ids"]) for row in rows)
        input_ids = torch.full((len(rows), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, row in enumerate(rows):
            ids = row["input_ids"]
            if ids:  # ``t[i, -0:]`` would address the whole row
                input_ids[i, width - len(ids) :] = torch.as_tensor(ids, dtype=torch.long)
                attention_mask[i, width - len(ids) :] = 1
        batch = {
            "input_ids": input_ids,
            "attention_mask": attention_mask,
            "prompts": [row["prompt"] for row in rows],
            "answers": [row["answer"] for row in rows],
        }
        if "class" in rows[0]:
            batch["classes"] = [row["class"] for row in rows]
        return batch


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


class PromptDataModule(LightningDataModule):
    """Prompts and ground-truth answers for GRPO/PPO; each batch is ``batch_size`` prompts per rank.

    Rows are read from ``train_dataset`` / ``val_dataset``, rendered to text, tokenized once in
    :meth:`setup` and kept in memory. Each of the two is one of:

    * ``"arithmetic"``: the embedded synthetic task (``lit_entropy.data.arithmetic``), generated from
      ``seed`` without any download; train draws split ``"train"``, validation split ``"validation"``,
      and the fields are always ``prompt``/``answer`` (the key settings do not apply).
    * a local file (``.json``, ``.jsonl``, ``.parquet``, ``.csv``), loaded with
      ``datasets.load_dataset(<builder>, data_files=path)`` into split ``"train"``; a local directory,
      loaded with ``datasets.load_dataset(dir)`` (splits inferred from the file names, e.g.
      ``train-*.parquet``) or ``datasets.load_from_disk`` when it was written by ``save_to_disk``.
    * otherwise a Hugging Face Hub dataset name for ``datasets.load_dataset(name, split=...)``.

    Rendering a prompt (``prompt_key`` may hold a string or a list of ``{"role", "content"}`` messages):

    * a string prompt first goes through ``prompt_template`` (every ``{prompt}`` is replaced by the
      prompt; other braces are kept verbatim, so ``\\boxed{}`` needs no escaping). Message lists are
      not templated.
    * ``apply_chat_template=True``: a string becomes one user message; ``system_prompt`` is prepended as a
      system message (a row that already has one is an error); the tokenizer's chat template renders
      the messages with ``add_generation_prompt=True``, and the text is tokenized without extra special
      tokens (the template carries them).
    * ``apply_chat_template=False``: the (templated) string is tokenized with the tokenizer's usual
      special tokens. A message list is an error naming ``prompt_key``; point ``prompt_key`` at the
      text instead (``"prompt.0.content"``) or enable the chat template. ``system_prompt`` needs the
      chat template.

    Args:
        train_dataset: ``"arithmetic"``, a local file/directory, or a Hub dataset name.
        val_dataset: Same choices, or None for no validation.
        train_split: Split of ``train_dataset`` to use (local files load as ``"train"``).
        val_split: Split of ``val_dataset`` to use (local files load as ``"train"``).
        prompt_key: Field holding the prompt. Dots address nested fields and list items, e.g.
            ``"prompt"`` (DAPO-Math-17k chat messages), ``"problem"`` (AIME files), ``"prompt.0.content"``.
            A column whose own name contains a dot is matched first.
        answer_key: Field holding the ground-truth answer, e.g. ``"reward_model.ground_truth"`` for
            DAPO-Math-17k; numbers become strings (integral floats without ``.0``).
        val_prompt_key: ``prompt_key`` for ``val_dataset`` when it differs (e.g. train on DAPO, validate
            on AIME); None reuses ``prompt_key``.
        val_answer_key: Likewise for ``answer_key``.
        class_key: Field holding each prompt's class or source (e.g. ``"data_source"``); validation then also
            logs ``val/avg@K/<class>`` per class. None = no breakdown. Not used with ``arithmetic``.
        apply_chat_template: Render prompts with the tokenizer's chat template.
        chat_template_kwargs: Extra variables for the chat template (as TRL's knob), e.g.
            ``{"enable_thinking": false}`` for Qwen3.
        system_prompt: System message prepended when ``apply_chat_template`` is True.
        prompt_template: Format applied to string prompts; must contain ``{prompt}``.
        tokenizer_name_or_path: Loaded with ``AutoTokenizer.from_pretrained`` (left padding, pad token
            falling back to eos). None: use :meth:`set_tokenizer`, or, for the ``"arithmetic"`` task, the
            embedded character tokenizer.
        batch_size: Prompts per training step per rank (completions per prompt are the module's business).
        val_batch_size: Prompts per validation step per rank; None uses ``batch_size``.
        max_prompt_length: Longest allowed prompt in tokens; None checks only the tokenizer's own
            ``model_max_length`` (when that is a real limit). Longer prompts raise in :meth:`setup`.
        filter_overlong_prompts: Drop prompts over the limits instead of raising (as verl's knob).
        num_train_examples: Training problems drawn from the ``"arithmetic"`` task.
        num_val_examples: Validation problems drawn from the ``"arithmetic"`` task.
        max_train_samples: Keep only the first N training rows of any source (None keeps all).
        max_val_samples: Keep only the first N validation rows of any source (None keeps all).
        seed: Seeds the arithmetic problems and the training shuffle order.
        shuffle: Shuffle training prompts (each epoch, deterministically from ``seed``).
        num_workers: DataLoader worker processes.
        arithmetic_options: Extra keyword arguments of ``make_arithmetic_examples`` (e.g. ``max_operand``,
            ``operations``).
        cache_dir: ``datasets`` cache directory (None: the library default).
    """

    def __init__(
        self,
        train_dataset: str = ARITHMETIC_DATASET,
        val_dataset: str | None = ARITHMETIC_DATASET,
        train_split: str = "train",
        val_split: str = "train",
        prompt_key: str = "prompt",
        answer_key: str = "answer",
        val_prompt_key: str | None = None,
        val_answer_key: str | None = None,
        class_key: str | None = None,
        apply_chat_template: bool = False,
        chat_template_kwargs: dict[str, Any] | None = None,
        system_prompt: str | None = None,
        prompt_template: str | None = None,
        tokenizer_name_or_path: str | None = None,
        batch_size: int = 8,
        val_batch_size: int | None = None,
        max_prompt_length: int | None = None,
        filter_overlong_prompts: bool = False,
        num_train_examples: int = 1024,
        num_val_examples: int = 128,
        max_train_samples: int | None = None,
        max_val_samples: int | None = None,
        seed: int = 0,
        shuffle: bool = True,
        num_workers: int = 0,
        arithmetic_options: dict[str, Any] | None = None,
        cache_dir: str | None = None,
    ) -> None:
        super().__init__()
        arguments = {name: value for name, value in locals().items() if name not in ("self", "__class__")}
        _check_arguments(arguments)
        self.save_hyperparameters()
        # Every argument is kept as an attribute of the same name (mutable defaults copied, val batch defaulted).
        for name, value in arguments.items():
            setattr(self, name, value)
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.arithmetic_options = dict(arithmetic_options or {})
        self.val_batch_size = val_batch_size if val_batch_size is not None else batch_size

        self._tokenizer: Any = None
        self._train_data: PromptDataset | None = None
        self._val_data: PromptDataset | None = None

    # ------------------------------------------------------------------ tokenizer

    def set_tokenizer(self, tokenizer: Any) -> None:
        """Use ``tokenizer`` (a transformers tokenizer object) instead of loading ``tokenizer_name_or_path``.

        Data tokenized with a previous tokenizer is discarded and rebuilt by the next :meth:`setup`.
        The object is not modified: batches are left-padded by :class:`PromptCollator`, whatever its
        ``padding_side``.
        """
        if not callable(tokenizer) or not hasattr(tokenizer, "pad_token_id"):
            raise ValueError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer).__name__}")
        self._tokenizer = tokenizer
        self._train_data = None
        self._val_data = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer, loaded on first use (see ``tokenizer_name_or_path``)."""
        if self._tokenizer is None:
            if self.tokenizer_name_or_path is not None:
                from transformers import AutoTokenizer

                from lit_entropy.models.paths import MODEL_PATH_SETTING, check_model_dir

                setting = f"tokenizer_name_or_path (lit-entropy: {MODEL_PATH_SETTING})"
                check_model_dir(self.tokenizer_name_or_path, setting, require_weights=False)
                tokenizer = AutoTokenizer.from_pretrained(self.tokenizer_name_or_path, padding_side="left")
                if tokenizer.pad_token is None and tokenizer.eos_token is not None:
                    # Common for Llama-style tokenizers; padding is masked out, so any id would do.
                    tokenizer.pad_token = tokenizer.eos_token
                self._tokenizer = tokenizer
            elif self.train_dataset == ARITHMETIC_DATASET and self.val_dataset in (ARITHMETIC_DATASET, None):
                from lit_entropy.data.char_tokenizer import build_char_tokenizer

                self._tokenizer = build_char_tokenizer()
            else:
                from lit_entropy.models.paths import MODEL_PATH_SETTING

                raise ValueError(
                    f"train_dataset={self.train_dataset!r} / val_dataset={self.val_dataset!r} need the tokenizer of "
                    f"the model being trained: the embedded model's character tokenizer only serves the "
                    f"{ARITHMETIC_DATASET!r} task. With lit-entropy set {MODEL_PATH_SETTING} to your model (the data "
                    "tokenizer follows it); with PromptDataModule set tokenizer_name_or_path (got None) or call "
                    "set_tokenizer()"
                )
        return self._tokenizer

    @property
    def pad_token_id(self) -> int:
        """Id used for left padding: the tokenizer's pad token, else its eos token."""
        tokenizer = self.tokenizer
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        if pad is None:
            raise ValueError(f"the tokenizer {type(tokenizer).__name__} has neither a pad nor an eos token")
        return int(pad)

    # ------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Download Hub datasets once per node (``setup`` then reads them from the cache)."""
        for setting, spec, split in (
            ("train_dataset", self.train_dataset, self.train_split),
            ("val_dataset", self.val_dataset, self.val_split),
        ):
            if spec is not None and spec != ARITHMETIC_DATASET and not _is_local(spec):
                self._load_hub(setting, spec, split, "train_split" if setting == "train_dataset" else "val_split")

    def setup(self, stage: str | None = None) -> None:
        """Load, render and tokenize the prompts of the stage (once); all data errors surface here."""
        if self.apply_chat_template and getattr(self.tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"apply_chat_template=True but the tokenizer {type(self.tokenizer).__name__} has no chat template "
                f"(tokenizer_name_or_path={self.tokenizer_name_or_path!r})"
            )
        if stage in (None, "fit"):
            if self._train_data is None:
                self._train_data = self._build("train")
            world_size = self.trainer.world_size if self.trainer is not None else 1
            per_rank = math.ceil(len(self._train_data) / world_size)
            if per_rank < self.batch_size:
                raise ValueError(
                    f"batch_size={self.batch_size} exceeds the {per_rank} training prompts per rank "
                    f"({len(self._train_data)} prompts over {world_size} ranks); with drop_last=True no batch is left"
                )
        if stage in (None, "fit", "validate", "test") and self.val_dataset is not None and self._val_data is None:
            self._val_data = self._build("val")

    def preflight(self) -> None:
        """Load, render and tokenize every configured source now (no model needed).

        ``lit-entropy fit`` calls it before the validation pass that precedes training, so that a bad
        training file (missing columns, encoding, characters the tokenizer cannot encode) is reported
        before any model is loaded or any validation runs.
        """
        if self._train_data is None:
            self._train_data = self._build("train")
        if self.val_dataset is not None and self._val_data is None:
            self._val_data = self._build("val")

    def train_dataloader(self) -> DataLoader:
        """Training prompts, shuffled from ``seed``, this data-parallel rank's share; resumable mid-epoch.

        The loader is a :class:`~lit_entropy.data.sampler.ResumableDataLoader`: Lightning checkpoints its
        position, so ``fit(ckpt_path=...)`` continues with the next unseen batch.
        """
        if self._train_data is None:
            self.setup("fit")
        assert self._train_data is not None
        sampler_kwargs = getattr(self.trainer, "distributed_sampler_kwargs", None) or {}
        sampler = ResumableDistributedSampler(
            self._train_data,
            num_replicas=int(sampler_kwargs.get("num_replicas", 1)),
            rank=int(sampler_kwargs.get("rank", 0)),
            shuffle=self.shuffle,
            seed=self.seed,
            drop_last=True,
        )
        return ResumableDataLoader(
            self._train_data,
            batch_size=self.batch_size,
            sampler=sampler,
            # Iterator creation draws the worker base seed from this generator, not from the global RNG
            # that a resume restores.
            generator=torch.Generator().manual_seed(self.seed),
            drop_last=True,  # GRPO batches of a fixed prompt count keep per-step cost and statistics comparable
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=PromptCollator(self.pad_token_id),
        )

    def val_dataloader(self) -> DataLoader | list:
        """Validation prompts in file order; an empty list (no validation) when ``val_dataset`` is None."""
        if self.val_dataset is None:
            return []
        if self._val_data is None:
            self.setup("validate")
        assert self._val_data is not None
        return DataLoader(
            self._val_data,
            batch_size=self.val_batch_size,
            shuffle=False,
            # Creating an iterator draws a worker seed from this generator, not from the global RNG that
            # training rollouts sample from (exact resume).
            generator=torch.Generator().manual_seed(self.seed),
            drop_last=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            collate_fn=PromptCollator(self.pad_token_id),
        )

    def test_dataloader(self) -> DataLoader | list:
        """``lit-entropy test`` evaluates on the validation prompts (the datamodule has no separate test split)."""
        return self.val_dataloader()

    @property
    def train_data(self) -> PromptDataset | None:
        """Tokenized training prompts (None before ``setup("fit")``)."""
        return self._train_data

    @property
    def val_data(self) -> PromptDataset | None:
        """Tokenized validation prompts (None before setup or without ``val_dataset``)."""
        return self._val_data

    def longest_prompt_tokens(self) -> int | None:
        """:class:`~lit_entropy.data.source.PromptSource`: longest tokenized prompt of the splits set up so far."""
        lengths = [len(ids) for data in (self.train_data, self.val_data) if data is not None for ids in data.input_ids]
        return max(lengths) if lengths else None

    def val_classes(self) -> list[str] | None:
        """Sorted class names of the validation prompts (``class_key``), or None without classes."""
        data = self.val_data
        classes = None if data is None else data.classes
        return None if classes is None else sorted(set(classes))

    def prompts_per_step(self) -> int:
        """:class:`~lit_entropy.data.source.PromptSource`: prompts per training batch, per rank."""
        return self.batch_size

    # ------------------------------------------------------------------ loading

    def _build(self, role: str) -> PromptDataset:
        """Load, render, tokenize and length-check the ``role`` ("train" or "val") prompts."""
        setting = f"{role}_dataset"
        spec = self.train_dataset if role == "train" else self.val_dataset
        assert spec is not None
        if spec == ARITHMETIC_DATASET:
            table = self._load_arithmetic(role)
            prompt_setting, prompt_key, answer_setting, answer_key = "prompt_key", "prompt", "answer_key", "answer"
        else:
            table = self._load_table(role, setting, spec)
            prompt_setting, prompt_key = "prompt_key", self.prompt_key
            answer_setting, answer_key = "answer_key", self.answer_key
            if role == "val" and self.val_prompt_key is not None:
                prompt_setting, prompt_key = "val_prompt_key", self.val_prompt_key
            if role == "val" and self.val_answer_key is not None:
                answer_setting, answer_key = "val_answer_key", self.val_answer_key
        where = f"{setting}={spec!r}"
        raw_prompts = _extract(table, prompt_setting, prompt_key, where)
        raw_answers = _extract(table, answer_setting, answer_key, where)
        answers = [_answer_text(value, answer_setting, answer_key, row, where) for row, value in enumerate(raw_answers)]
        prompts = [self._render(value, prompt_setting, prompt_key, row, where) for row, value in enumerate(raw_prompts)]
        classes = None
        if self.class_key is not None and spec != ARITHMETIC_DATASET:
            classes = [str(value) for value in _extract(table, "class_key", self.class_key, where)]
        # The chat template already holds the model's special tokens (e.g. BOS); don't add them twice.
        encoded = self.tokenizer(prompts, add_special_tokens=not self.apply_chat_template)["input_ids"]
        input_ids = [list(ids) for ids in encoded]
        self._check_unknown_tokens(prompts, where, spec)
        keep = self._length_check(input_ids, prompts, where)
        if len(keep) < len(input_ids):
            input_ids = [input_ids[i] for i in keep]
            prompts = [prompts[i] for i in keep]
            answers = [answers[i] for i in keep]
            classes = None if classes is None else [classes[i] for i in keep]
            if not keep:
                raise ValueError(f"{where}: filter_overlong_prompts removed every prompt")
        return PromptDataset(input_ids, prompts, answers, classes)

    def _load_arithmetic(self, role: str) -> Any:
        import datasets

        from lit_entropy.data.arithmetic import make_arithmetic_examples

        count_setting = "num_train_examples" if role == "train" else "num_val_examples"
        count = self.num_train_examples if role == "train" else self.num_val_examples
        split = "train" if role == "train" else "validation"
        try:
            rows = make_arithmetic_examples(split, count, seed=self.seed, **self.arithmetic_options)
        except (TypeError, ValueError) as err:
            raise ValueError(
                f"cannot build the arithmetic {split!r} split with {count_setting}={count}, "
                f"arithmetic_options={self.arithmetic_options!r}: {err}"
            ) from err
        limit = self.max_train_samples if role == "train" else self.max_val_samples
        rows = rows[:limit] if limit is not None else rows
        return datasets.Dataset.from_list(rows)

    def _load_table(self, role: str, setting: str, spec: str) -> Any:
        """The ``datasets.Dataset`` of a local or Hub source, subset to ``max_{role}_samples``."""
        split_setting = f"{role}_split"
        split = self.train_split if role == "train" else self.val_split
        if _is_local(spec):
            table = self._load_local(setting, spec, split_setting, split)
        else:
            table = self._load_hub(setting, spec, split, split_setting)
        limit = self.max_train_samples if role == "train" else self.max_val_samples
        if limit is not None and limit < len(table):
            table = table.select(range(limit))
        if len(table) == 0:
            raise ValueError(f"{setting}={spec!r} ({split_setting}={split!r}) is empty")
        return table

    def _load_local(self, setting: str, spec: str, split_setting: str, split: str) -> Any:
        import datasets

        path = Path(spec).expanduser()
        if not path.exists():
            raise ValueError(f"{setting}={spec!r} does not exist")
        if path.is_dir() and ((path / "dataset_dict.json").exists() or (path / "state.json").exists()):
            loaded = datasets.load_from_disk(str(path))
            if isinstance(loaded, datasets.Dataset):  # a single saved split
                loaded = datasets.DatasetDict({"train": loaded})
        elif path.is_dir():
            try:
                loaded = datasets.load_dataset(str(path), cache_dir=self.cache_dir)
            except Exception as err:  # datasets raises several types for unusable directories
                raise ValueError(f"{setting}={spec!r}: cannot load the directory with datasets: {err}") from err
        else:
            builder = _BUILDERS.get(path.suffix.lower())
            if builder is None:
                raise ValueError(
                    f"{setting}={spec!r} has unsupported extension {path.suffix!r}; expected one of {sorted(_BUILDERS)}"
                )
            if builder in ("json", "csv"):
                _check_utf8(setting, spec, path)
            try:
                loaded = datasets.load_dataset(builder, data_files=str(path), cache_dir=self.cache_dir)
            except Exception as err:  # malformed files raise builder-specific errors
                raise ValueError(f"{setting}={spec!r}: cannot read the {builder} file: {err}") from err
        if split not in loaded:
            raise ValueError(f"{split_setting}={split!r} is not a split of {setting}={spec!r} (splits: {list(loaded)})")
        return loaded[split]

    def _load_hub(self, setting: str, spec: str, split: str, split_setting: str) -> Any:
        import datasets

        try:
            return datasets.load_dataset(spec, split=split, cache_dir=self.cache_dir)
        except Exception as err:  # offline, unknown name, unknown split, ...
            raise ValueError(
                f"{setting}={spec!r} is not a local path and cannot be loaded from the Hugging Face Hub "
                f"({split_setting}={split!r}): {err}"
            ) from err

    # ------------------------------------------------------------------ rendering

    def _render(self, value: Any, setting: str, key: str, row: int, where: str) -> str:
        """Prompt text for one row (see the class docstring for the rules)."""
        if isinstance(value, str):
            text = self.prompt_template.replace("{prompt}", value) if self.prompt_template is not None else value
            if not self.apply_chat_template:
                return text
            messages = [{"role": "user", "content": text}]
        elif isinstance(value, Sequence) and value and all(_is_message(m) for m in value):
            if not self.apply_chat_template:
                raise ValueError(
                    f"{setting}={key!r} holds chat messages (row {row} of {where}) but apply_chat_template=False; "
                    f"set apply_chat_template=True or point {setting} at the text (e.g. '{key}.0.content')"
                )
            messages = [{"role": m["role"], "content": m["content"]} for m in value]
        else:
            raise ValueError(
                f"{setting}={key!r}: row {row} of {where} is neither a string nor a list of "
                f"{{'role', 'content'}} messages: {_short(value)}"
            )
        if self.system_prompt is not None:
            if messages[0]["role"] == "system":
                raise ValueError(
                    f"system_prompt={_short(self.system_prompt)} is set but row {row} of {where} already starts with "
                    f"a system message; unset system_prompt"
                )
            messages = [{"role": "system", "content": self.system_prompt}, *messages]
        rendered = self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
        )
        if not isinstance(rendered, str):
            raise ValueError(f"apply_chat_template=True: the chat template returned {type(rendered).__name__}, not str")
        return rendered

    def _check_unknown_tokens(self, prompts: list[str], where: str, spec: str) -> None:
        """Refuse prompts with characters the tokenizer cannot represent (they would vanish silently).

        A character is unknown when, encoded alone, it gives no token or the unknown token. Byte-level
        tokenizers (Qwen, Llama, GPT-2) encode every character; the embedded character tokenizer drops
        anything outside the arithmetic alphabet. Whitespace is not checked (many tokenizers fold it).
        """
        distinct = sorted({c for prompt in prompts for c in prompt if not c.isspace()})
        if not distinct:
            return
        unk = getattr(self.tokenizer, "unk_token_id", None)
        encoded = self.tokenizer(distinct, add_special_tokens=False)["input_ids"]
        chars = {
            c: None for c, ids in zip(distinct, encoded, strict=True) if not ids or (unk is not None and unk in ids)
        }
        if not chars:
            return
        bad_rows = [row for row, prompt in enumerate(prompts) if any(c in chars for c in prompt)]
        row = bad_rows[0]
        first = [c for c in dict.fromkeys(prompts[row]) if c in chars]
        line = _source_line(spec, row)
        at = f"row {row}" + (f" (line {line} of {spec})" if line is not None else "")
        if self.tokenizer_name_or_path is None:  # the embedded character tokenizer
            from lit_entropy.data.arithmetic import ARITHMETIC_ALPHABET

            fix = f"the embedded character tokenizer knows only {ARITHMETIC_ALPHABET!r}"
        else:
            fix = f"use a model whose tokenizer covers them (tokenizer_name_or_path={self.tokenizer_name_or_path!r})"
        in_template = self.prompt_template is not None and any(c in self.prompt_template for c in chars)
        template = " (some come from prompt_template)" if in_template else ""
        raise ValueError(
            f"{where}: the tokenizer cannot encode the characters {''.join(chars)!r}{template} ({len(bad_rows)} of "
            f"{len(prompts)} prompts); first at {at}: {first!r} in {_short(prompts[row])}. They would become "
            f"<unk> and be dropped when decoded; {fix}"
        )

    def _length_check(self, input_ids: list[list[int]], prompts: list[str], where: str) -> list[int]:
        """Indices of the rows within the limits; raises on the first overlong row unless filtering."""
        context = getattr(self.tokenizer, "model_max_length", None)
        has_context = isinstance(context, int) and context < _NO_CONTEXT_LIMIT
        keep = []
        for row, ids in enumerate(input_ids):
            if self.max_prompt_length is not None and len(ids) > self.max_prompt_length:
                limit = f"max_prompt_length={self.max_prompt_length}"
            elif has_context and len(ids) > context:
                limit = f"the tokenizer's model_max_length={context}"
            else:
                keep.append(row)
                continue
            if not self.filter_overlong_prompts:
                raise ValueError(
                    f"{limit}: the prompt of row {row} of {where} has {len(ids)} tokens: {_short(prompts[row])} "
                    f"(set filter_overlong_prompts=True to drop such rows)"
                )
        return keep


# ---------------------------------------------------------------------- helpers


def _is_local(spec: str) -> bool:
    """Whether ``spec`` names a local path (existing, path-like, or with a data-file extension)."""
    path = Path(spec).expanduser()
    return path.exists() or spec.startswith(("/", "./", "../", "~")) or path.suffix.lower() in _BUILDERS


def _check_local_source(setting: str, spec: str | None) -> None:
    """At construction: a local data file that is missing or empty is reported before anything loads."""
    if spec is None or spec == ARITHMETIC_DATASET or not isinstance(spec, str) or not _is_local(spec):
        return
    path = Path(spec).expanduser()
    if not path.exists():
        raise ValueError(
            f"{setting}={spec!r} does not exist (resolved to {path.resolve()}); check the path and the working "
            "directory"
        )
    if path.is_file() and path.stat().st_size == 0:
        raise ValueError(f"{setting}={spec!r} is an empty file (0 bytes)")


def _check_utf8(setting: str, spec: str, path: Path) -> None:
    """Name the file, line and bytes of the first invalid UTF-8 sequence of a text data file."""
    with open(path, "rb") as handle:
        for number, line in enumerate(handle, start=1):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"{setting}={spec!r} is not UTF-8 text: line {number}, column {err.start + 1} has the bytes "
                    f"{line[err.start : err.end + 3]!r}; re-encode the file as UTF-8 (e.g. iconv -f latin1 -t utf-8)"
                ) from None


def _source_line(spec: str, row: int) -> int | None:
    """Line of row ``row`` in a .jsonl / .csv file (blank lines and quoted newlines accounted), else None."""
    path = Path(spec).expanduser()
    suffix = path.suffix.lower()
    if not path.is_file() or suffix not in (".jsonl", ".csv"):
        return None
    with open(path, encoding="utf-8", newline="") as handle:
        if suffix == ".jsonl":
            starts = [number for number, line in enumerate(handle, start=1) if line.strip()]
        else:
            import csv

            reader = csv.reader(handle)
            starts, previous = [], 0
            for _ in reader:
                starts.append(previous + 1)
                previous = reader.line_num
            starts = starts[1:]  # the header
    return starts[row] if row < len(starts) else None


def _is_message(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SNIPPET else text[: _SNIPPET - 3] + "..."


def _extract(table: Any, setting: str, key: str, where: str) -> list[Any]:
    """Values of field ``key`` (a dotted path through dicts and lists) for every row of a ``datasets.Dataset``."""
    columns = table.column_names
    if key in columns:  # a column whose own name contains dots wins over the path reading
        return list(table[key])
    head, *rest = key.split(".")
    if head not in columns:
        import difflib

        close = difflib.get_close_matches(head, columns, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"{setting}={key!r} is not a column of {where} (available columns: {columns}){hint}")
    values = []
    for row, value in enumerate(table[head]):
        for depth, part in enumerate(rest):
            at = ".".join([head, *rest[:depth]])
            if isinstance(value, Mapping):
                if part not in value:
                    raise ValueError(
                        f"{setting}={key!r}: row {row} of {where} has no field {part!r} under {at!r} "
                        f"(available: {sorted(value)})"
                    )
                value = value[part]
            elif isinstance(value, Sequence) and not isinstance(value, str):
                if not part.lstrip("-").isdigit() or not -len(value) <= int(part) < len(value):
                    raise ValueError(
                        f"{setting}={key!r}: row {row} of {where}: {at!r} is a list of {len(value)} items, "
                        f"{part!r} is not a valid index"
                    )
                value = value[int(part)]
            else:
                raise ValueError(
                    f"{setting}={key!r}: row {row} of {where}: {at!r} is a {type(value).__name__}, "
                    f"which has no field {part!r}"
                )
        values.append(value)
    return values


def _answer_text(value: Any, setting: str, key: str, row: int, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        # csv/parquet readers turn integer columns with a float or a gap into float64: 4.0 means "4"
        return str(int(value)) if value.is_integer() else str(value)
    raise ValueError(f"{setting}={key!r}: row {row} of {where} holds {_short(value)}, not a string or number")


def _check_arguments(args: Mapping[str, Any]) -> None:
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
        _check_local_source(name, value)

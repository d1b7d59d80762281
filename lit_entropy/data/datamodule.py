"""Prompt data for RL fine-tuning: ``(prompt, answer)`` pairs, tokenized once, served as left-padded batches.

The LightningModule samples the completions itself, so a batch carries only prompts (and the ground-truth
answers its reward function needs). Sources are the embedded synthetic ``"arithmetic"`` task, local
json/jsonl/parquet/csv files or directories, and Hugging Face Hub datasets.

This module holds the LightningDataModule; the concerns it composes live beside it:
:mod:`~lit_entropy.data.batches` (the tokenized dataset and the collator), :mod:`~lit_entropy.data.reading`
(sources and fields), :mod:`~lit_entropy.data.rendering`
(prompt and answer text), :mod:`~lit_entropy.data.tokenizing` (tokenizer, encoding, token checks) and
:mod:`~lit_entropy.data.arguments` (argument checks).
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader

from lit_entropy.data import reading, tokenizing
from lit_entropy.data.arguments import check_arguments
from lit_entropy.data.batches import PromptCollator, PromptDataset
from lit_entropy.data.reading import ARITHMETIC_DATASET
from lit_entropy.data.rendering import PromptRenderer, answer_text
from lit_entropy.data.sampler import ResumableDataLoader, ResumableDistributedSampler

__all__ = ["ARITHMETIC_DATASET", "PromptCollator", "PromptDataModule", "PromptDataset"]


class PromptDataModule(LightningDataModule):
    """Prompts and ground-truth answers for GRPO/PPO; each batch is ``batch_size`` prompts per rank.

    Rows are read from ``train_dataset`` / ``val_dataset``, rendered to text, tokenized once in
    :meth:`setup` and kept in memory. Each of the two is one of:

    * ``"arithmetic"``: the embedded synthetic task (``lit_entropy.data.arithmetic``), generated from
      ``seed`` without any download; train draws split ``"train"``, validation split ``"validation"``,
      and the fields are always ``prompt``/``answer`` (the key settings do not apply).
    * ``"package.module:function"``: a Python function, imported (from the working directory too) and called
      without arguments; it returns the rows (a list of dicts, or a ``datasets.Dataset``). The split settings
      do not apply: name one function per split (``my_task:train_rows``, ``my_task:val_rows``).
    * ``"word_problems"`` / ``"word_problems_1op"`` / ``"word_problems_easy"``: embedded grade-school word problems
      with 1-3 operations / one / one addition of small numbers asking for the number only
      (``lit_entropy.data.word_problems``; reward ``word_problem``), for a real chat model (``apply_chat_template``);
      as for arithmetic, plus ``val_split: test`` for the test split and ``class_key: operations``.
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
        train_dataset: ``"arithmetic"``, ``"package.module:function"``, a local file/directory, or a Hub dataset
            name.
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
        num_train_examples: Training problems drawn from an embedded task (``arithmetic``, ``word_problems``).
        num_val_examples: Validation problems drawn from an embedded task.
        max_train_samples: Keep only the first N training rows of any source (None keeps all).
        max_val_samples: Keep only the first N validation rows of any source (None keeps all).
        seed: Seeds the arithmetic problems and the training shuffle order.
        shuffle: Shuffle training prompts (each epoch, deterministically from ``seed``).
        num_workers: DataLoader worker processes.
        arithmetic_options: Extra keyword arguments of ``make_arithmetic_examples`` (e.g. ``max_operand``,
            ``operations``).
        cache_dir: ``datasets`` cache directory (None: the library default).
    """

    # The arguments, kept as attributes of the same names by __init__ (declared here for readers and type checkers).
    train_dataset: str
    val_dataset: str | None
    train_split: str
    val_split: str
    prompt_key: str
    answer_key: str
    val_prompt_key: str | None
    val_answer_key: str | None
    class_key: str | None
    apply_chat_template: bool
    chat_template_kwargs: dict[str, Any]
    system_prompt: str | None
    prompt_template: str | None
    tokenizer_name_or_path: str | None
    batch_size: int
    val_batch_size: int
    max_prompt_length: int | None
    filter_overlong_prompts: bool
    num_train_examples: int
    num_val_examples: int
    max_train_samples: int | None
    max_val_samples: int | None
    seed: int
    shuffle: bool
    num_workers: int
    arithmetic_options: dict[str, Any]
    cache_dir: str | None

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
        check_arguments(arguments)
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
            self._tokenizer = tokenizing.load_tokenizer(
                self.tokenizer_name_or_path, self.train_dataset, self.val_dataset
            )
        return self._tokenizer

    @property
    def pad_token_id(self) -> int:
        """Id used for left padding: the tokenizer's pad token, else its eos token."""
        return tokenizing.pad_token_id(self.tokenizer)

    # ------------------------------------------------------------------ Lightning hooks

    def prepare_data(self) -> None:
        """Download Hub datasets once per node (``setup`` then reads them from the cache)."""
        for setting, spec, split in (
            ("train_dataset", self.train_dataset, self.train_split),
            ("val_dataset", self.val_dataset, self.val_split),
        ):
            if spec is None or reading.is_embedded(spec) or reading.is_function(spec) or reading.is_local(spec):
                continue
            split_setting = "train_split" if setting == "train_dataset" else "val_split"
            reading.load_hub(setting, spec, split_setting, split, self.cache_dir)

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
            self._check_batch_fits(self.trainer.world_size if self.trainer is not None else 1)
        if stage in (None, "fit", "validate", "test") and self.val_dataset is not None and self._val_data is None:
            self._val_data = self._build("val")

    def preflight(self, stage: str = "fit", world_size: int = 1) -> None:
        """Load, render and tokenize every source ``stage`` reads now (no model needed); for ``"fit"`` also check
        that one training batch per rank fits.

        ``lit-entropy`` calls it before any model is loaded or any validation runs, so that a bad data file
        (missing columns, encoding, characters the tokenizer cannot encode, too few rows for a batch) is
        reported first, in one line.

        Args:
            stage: ``"fit"`` (training and validation data) or ``"validate"`` / ``"test"`` (validation data).
            world_size: Data-parallel ranks the training batches are spread over.
        """
        if stage == "fit":
            if self._train_data is None:
                self._train_data = self._build("train")
            self._check_batch_fits(world_size)
        if self.val_dataset is not None and self._val_data is None:
            self._val_data = self._build("val")

    def train_batches_per_epoch(self, world_size: int = 1) -> int:
        """Training batches each rank draws per pass over the data (``drop_last``: incomplete batches dropped)."""
        return self._prompts_per_rank(world_size) // self.batch_size

    def _prompts_per_rank(self, world_size: int) -> int:
        """Training prompts each rank draws per pass (the sampler drops the tail that does not divide evenly)."""
        if self._train_data is None:
            raise ValueError("the training data is not built yet: call preflight() or setup('fit') first")
        return len(ResumableDistributedSampler(self._train_data, num_replicas=world_size, drop_last=True))

    def _check_batch_fits(self, world_size: int) -> None:
        """Refuse a ``batch_size`` larger than one rank's share of the training prompts (no batch would be left)."""
        assert self._train_data is not None
        per_rank = self._prompts_per_rank(world_size)
        if per_rank < self.batch_size:
            spread = "" if world_size == 1 else f" per rank ({len(self._train_data)} prompts over {world_size} ranks)"
            raise ValueError(
                f"batch_size={self.batch_size} exceeds the {per_rank} training prompts{spread} of "
                f"train_dataset={self.train_dataset!r}: no full batch is left (incomplete batches are dropped); "
                f"set batch_size to at most {per_rank} or add rows"
            )

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

    # ------------------------------------------------------------------ building

    def _build(self, role: str) -> PromptDataset:
        """Load, render, tokenize and length-check the ``role`` ("train" or "val") prompts."""
        setting = f"{role}_dataset"
        spec = self.train_dataset if role == "train" else self.val_dataset
        assert spec is not None
        table, (prompt_setting, prompt_key), (answer_setting, answer_key) = self._read(role, setting, spec)
        where = f"{setting}={spec!r}"
        fields = {prompt_setting: prompt_key, answer_setting: answer_key}
        if self.class_key is not None and spec != ARITHMETIC_DATASET:
            fields["class_key"] = self.class_key

        def others(setting: str) -> dict[str, str]:  # the fields the other settings read: not suggested for this one
            return {name: key for name, key in fields.items() if name != setting}

        raw_prompts = reading.extract_field(table, prompt_setting, prompt_key, where, others(prompt_setting))
        raw_answers = reading.extract_field(table, answer_setting, answer_key, where, others(answer_setting))
        answers = [answer_text(value, answer_setting, answer_key, row, where) for row, value in enumerate(raw_answers)]
        renderer = PromptRenderer(
            self.tokenizer,
            self.apply_chat_template,
            self.prompt_template,
            self.system_prompt,
            self.chat_template_kwargs,
        )
        prompts = [
            renderer.render(value, prompt_setting, prompt_key, row, where) for row, value in enumerate(raw_prompts)
        ]
        classes = None
        if self.class_key is not None and spec != ARITHMETIC_DATASET:
            read = reading.extract_field(table, "class_key", self.class_key, where, others("class_key"))
            classes = [str(value) for value in read]
        input_ids = tokenizing.encode_prompts(self.tokenizer, prompts, self.apply_chat_template)
        tokenizing.check_unknown_tokens(
            self.tokenizer, prompts, where, spec, self.tokenizer_name_or_path, self.prompt_template
        )
        keep = tokenizing.rows_within_limits(
            self.tokenizer, input_ids, prompts, where, self.max_prompt_length, self.filter_overlong_prompts
        )
        if len(keep) < len(input_ids):
            if not keep:
                raise ValueError(f"{where}: filter_overlong_prompts removed every prompt")
            input_ids, prompts, answers = (
                [input_ids[i] for i in keep],
                [prompts[i] for i in keep],
                [answers[i] for i in keep],
            )
            classes = None if classes is None else [classes[i] for i in keep]
        return PromptDataset(input_ids, prompts, answers, classes)

    def _read(self, role: str, setting: str, spec: str) -> tuple[Any, tuple[str, str], tuple[str, str]]:
        """The ``role`` source's table and its (setting, key) of the prompt and of the answer field."""
        limit = self.max_train_samples if role == "train" else self.max_val_samples
        if spec == ARITHMETIC_DATASET:
            count_setting = f"num_{role}_examples"
            table = reading.load_arithmetic(
                "train" if role == "train" else "validation",
                getattr(self, count_setting),
                count_setting,
                self.seed,
                self.arithmetic_options,
            )
            if limit is not None and limit < len(table):
                table = table.select(range(limit))
            return table, ("prompt_key", "prompt"), ("answer_key", "answer")
        if reading.is_embedded(spec):  # word problems: validation draws its split, or "test" where val_split says so
            count_setting = f"num_{role}_examples"
            split = "train" if role == "train" else ("test" if self.val_split == "test" else "validation")
            table = reading.load_word_problems(spec, split, getattr(self, count_setting), count_setting, self.seed)
            if limit is not None and limit < len(table):
                table = table.select(range(limit))
            return table, ("prompt_key", "prompt"), ("answer_key", "answer")
        split_setting = f"{role}_split"
        table = reading.load_table(setting, spec, split_setting, getattr(self, split_setting), limit, self.cache_dir)
        prompt = ("prompt_key", self.prompt_key)
        answer = ("answer_key", self.answer_key)
        if role == "val" and self.val_prompt_key is not None:
            prompt = ("val_prompt_key", self.val_prompt_key)
        if role == "val" and self.val_answer_key is not None:
            answer = ("val_answer_key", self.val_answer_key)
        return table, prompt, answer

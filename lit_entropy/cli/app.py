"""The ``lit-entropy`` command: LightningCLI over :class:`RFTModule` and :class:`PromptDataModule`."""

from __future__ import annotations

import copy
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import yaml
from jsonargparse import ArgumentError, set_parsing_settings
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import ArgsType, LightningCLI, SaveConfigCallback

import lit_entropy.callbacks  # noqa: F401  (registers the callbacks: --trainer.callbacks+=ClipCov works by short name)
from lit_entropy import __version__
from lit_entropy.checkpointing import DiskFullError
from lit_entropy.cli.errors import SettingsError
from lit_entropy.cli.export import export_main
from lit_entropy.cli.interrupts import interruption_exit_status
from lit_entropy.cli.output_paths import check_output_paths
from lit_entropy.cli.overview import COMMANDS
from lit_entropy.cli.parse_errors import explain_build_error, explain_parse_error
from lit_entropy.cli.parser import RFTArgumentParser
from lit_entropy.cli.preflight import apply_default_budget, check_cadences, preflight_data
from lit_entropy.cli.quiet import off_terminal, quiet_checkpoint_restore
from lit_entropy.cli.resume import (
    check_data_unchanged,
    check_same_weights_layout,
    deep_merge,
    explicit_changes,
    read_checkpoint_hparams,
    report_setting_changes,
    resolve_null_estimator,
    resolve_null_loss_agg_mode,
)
from lit_entropy.cli.run_dir import claim_version_dirs, loggers_kept_open, place_logger, release_unused_run_dirs
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.functional.registry import ADVANTAGE_ESTIMATORS, POLICY_LOSSES, Registry
from lit_entropy.internals.cli import append_help, subcommand_parser
from lit_entropy.internals.lightning import (
    add_subcommand_parsers,
    hpc_resume_path,
    hpc_resume_path_in,
    run_cli_subcommand,
)
from lit_entropy.models.packaged import is_packaged_name, resolve_model_path
from lit_entropy.models.paths import MODEL_PATH_SETTING, check_model_dir
from lit_entropy.module import RFTModule
from lit_entropy.rewards import RewardFunctionError
from lit_entropy.settings import check_legacy_model_keys
from lit_entropy.training.health import PolicyDiverged

__all__ = ["RFTCLI", "cli_main", "main"]

# RL-friendly defaults: every step is an optimizer update worth logging, and a sanity validation
# pass would spend a full generation round before training starts.
TRAINER_DEFAULTS: dict[str, Any] = {
    "log_every_n_steps": 1,
    "num_sanity_val_steps": 0,
    # Lightning's table lists the module's helpers and a FLOPs column that is 0 without an example input;
    # ConsoleMetrics prints the parameter counts in one line instead.
    "enable_model_summary": False,
    "logger": {
        "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
        # No placeholder `hp_metric` (it would add an experiment summary): HPARAMS takes its metrics from the scalars.
        "init_args": {"save_dir": "runs", "name": "lit_entropy", "default_hp_metric": False},
    },
}

_DESCRIPTION = "lit_entropy: reinforcement fine-tuning of causal language models (GRPO, PPO) with PyTorch Lightning"
_EPILOG = (
    "Also: 'lit-entropy export --ckpt_path CKPT --out DIR [--overwrite]' writes a checkpoint's policy as a "
    "Hugging Face save_pretrained directory; 'lit-entropy --version' prints the version."
)


class RunDirectoryGuard(SaveConfigCallback):
    """Lightning's ``SaveConfigCallback`` that refuses to reuse a previous run's log directory.

    A logger version directory that already holds a ``config.yaml`` or an ``hf_model`` export belongs to
    an earlier run; writing into it would overwrite that run's config and export. ``--overwrite_run true``
    allows it on purpose. Without a logger nothing is written (there is no run directory).

    Args:
        resumed_run: ``fit --ckpt_path`` continues the run that owns the directory: nothing is refused.
        **kwargs: ``SaveConfigCallback``'s.
    """

    def __init__(self, *args: Any, resumed_run: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.resumed_run = resumed_run

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.logger is None:
            # No run directory: Lightning would write config.yaml into the working directory, over any file
            # of that name there.
            self.already_saved = True
            return
        if not self.already_saved and self.save_to_log_dir and not self.overwrite and not self.resumed_run:
            log_dir = trainer.log_dir
            taken = []
            if log_dir is not None and trainer.is_global_zero:
                taken = [name for name in (self.config_filename, "hf_model") if (Path(log_dir) / name).exists()]
            taken = trainer.strategy.broadcast(taken)
            if taken:
                raise SettingsError(
                    f"trainer.logger.init_args.version: the log directory {log_dir} already holds a previous run "
                    f"({', '.join(taken)}); refusing to "
                    "overwrite it. Pick a new version (leave trainer.logger.init_args.version unset for the next "
                    "free one, or set --trainer.logger.init_args.version=<new>) or pass --overwrite_run true to "
                    "overwrite it on purpose"
                )
        if self.resumed_run:  # the run's own checkpoints are there: expected, not a reused directory
            warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
        # The check above replaces Lightning's; it would refuse only config.yaml, with a message about its API.
        self.overwrite = True
        super().setup(trainer, pl_module, stage)


def command_line_words(args: ArgsType) -> list[str] | None:
    """The words LightningCLI parses: ``args`` when given as a list, ``sys.argv[1:]`` when ``None``, and
    ``None`` for a dict or namespace of settings (no command line to read)."""
    if args is None:
        return sys.argv[1:]
    return list(args) if isinstance(args, (list, tuple)) else None


class RFTCLI(LightningCLI):
    """LightningCLI with the tokenizer linked from the model and lit_entropy's trainer defaults.

    Only the subcommand named on the command line gets its settings parser (each one walks the signatures
    of the Trainer, the module and the datamodule: most of the time ``fit --help`` or a mistyped flag takes).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._command_line = command_line_words(kwargs.get("args"))
        self._claimed_run_dirs: list[Path] = []
        super().__init__(*args, **kwargs)

    def _run_subcommand(self, subcommand: str) -> None:
        # The run takes its version directory first (atomically); one that fails before its first training
        # step gives it back, so the next run gets that number and no empty or config-only directory remains.
        self._claimed_run_dirs = claim_version_dirs(self.trainer)
        try:
            run_cli_subcommand(self, subcommand)  # LightningCLI's own
        except BaseException:
            release_unused_run_dirs(self._claimed_run_dirs, self.trainer)
            raise

    @staticmethod
    def subcommands() -> dict[str, set[str]]:
        # predict is not offered: the module has no predict_step (``test`` evaluates on the validation data).
        return {
            "fit": {"model", "train_dataloaders", "val_dataloaders", "datamodule"},
            "validate": {"model", "dataloaders", "datamodule"},
            "test": {"model", "dataloaders", "datamodule"},
        }

    def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
        named = next((arg for arg in self._command_line or () if arg in self.subcommands()), None)
        chosen = [named] if named else list(self.subcommands())  # none named: all (the parser reports the error)
        add_subcommand_parsers(self, parser, {name: COMMANDS[name] for name in chosen}, **kwargs)

    def add_arguments_to_parser(self, parser: Any) -> None:
        # The prompts must be tokenized by the policy's own tokenizer.
        parser.link_arguments("model.policy.model_name_or_path", "data.tokenizer_name_or_path")
        parser.add_argument(
            "--val_before_train",
            type=bool,
            default=True,
            help="fit: validate the starting model first, so val/* curves start at step 0 (verl's val_before_train)",
        )
        add_safety_arguments(parser)
        document_registered_names(parser)

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        self.save_config_kwargs["overwrite"] = bool(config.get("overwrite_run", False))
        check_manual_optimization(config["trainer"])
        if config["trainer"].get("enable_progress_bar") is None and off_terminal():
            # Off a terminal the step lines of ConsoleMetrics replace Lightning's bar (docs/dashboard.md): its
            # redraws, v_num and final epoch block are noise in a log file. A bar asked for explicitly stays.
            config["trainer"]["enable_progress_bar"] = False
        if self.subcommand in ("fit", None):  # None: run=False, a trainer built for fit
            apply_default_budget(config["trainer"])

    def instantiate_classes(self) -> None:
        try:
            super().instantiate_classes()
        except (ValueError, TypeError, MisconfigurationException) as err:
            line = explain_build_error(err, self._settings_parser())
            if isinstance(err, MisconfigurationException) and not line.startswith("trainer"):
                line = f"trainer: {line}"  # Lightning's Trainer refused a combination of its arguments
            raise SettingsError(line) from err

    def _settings_parser(self) -> Any:
        """The parser of the running subcommand (it holds the settings' types), else the main one."""
        return subcommand_parser(self, self.subcommand)

    def parse_arguments(self, parser: Any, args: ArgsType) -> None:
        # Old model keys (pre-0.2 flat ones, renamed ones) get an error naming their new place, not jsonargparse's.
        try:
            check_legacy_arguments(self._command_line or [])
        except ValueError as error:
            parser.exit(2, f"lit-entropy: error: {error}\n")
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        """``--ckpt_path``: the checkpoint's model settings fill in what the user did not set; what the user
        set explicitly and differs is refused by ``fit`` (or honoured with a warning), honoured with a warning
        by ``validate`` / ``test`` (docs/checkpoints.md, "Resuming with other settings").

        Replaces Lightning's version, which lets the checkpoint's hyper-parameters override explicit ones
        silently (and loads the whole checkpoint into memory to read them).
        """
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if not ckpt_path and subcommand == "fit":
            ckpt_path = requeue_checkpoint(self.config[subcommand]["trainer"])
        if not ckpt_path:
            return
        saved = read_checkpoint_hparams(ckpt_path)
        given = self._command_line  # re-parsed without defaults to tell the explicit settings
        explicit: dict[str, dict[str, Any]] = {"model": {}, "data": {}}
        if given is not None:
            namespace = self.parser.parse_args(given, defaults=False)[subcommand]
            for section in explicit:
                value = namespace.get(section)
                explicit[section] = value.as_dict() if hasattr(value, "as_dict") else dict(value or {})
        model = {k: v for k, v in saved["model"].items() if not str(k).startswith("_")}
        if model:  # Lightning's behaviour for the settings not given: the checkpoint's
            merged = deep_merge(model, explicit["model"])
            self.parser.exit_on_error = False  # a stored setting that no longer parses: one line naming the file
            try:
                self.config = self.parser.parse_object({subcommand: {"model": merged}}, self.config)
            except ArgumentError as err:
                line = explain_parse_error(str(err), self._settings_parser())
                raise SettingsError(f"the model settings stored in {ckpt_path} do not parse: {line}") from err
            finally:
                self.parser.exit_on_error = True
        saved_model = copy.deepcopy(dict(saved["model"]))
        resolve_null_estimator(saved_model, explicit["model"])
        resolve_null_loss_agg_mode(saved_model, explicit["model"])
        changes = explicit_changes(saved_model, explicit["model"], "model")
        changes += explicit_changes(saved["data"], explicit["data"], "data")
        allow = subcommand != "fit" or bool(self.config[subcommand].get("resume_with_changes", False))
        report_setting_changes(ckpt_path, changes, subcommand, allow_changes=allow)
        if subcommand == "fit":
            spec = self.config[subcommand]["data"].get("train_dataset")
            check_data_unchanged(ckpt_path, saved["data_fingerprint"], spec, allow=allow)
        policy = self.config[subcommand]["model"].get("policy")
        check_same_weights_layout(ckpt_path, saved["lora_weights"], policy.get("lora") if policy else None)
        step = saved["trained_batches"]
        if place_logger(self.config[subcommand]["trainer"], subcommand, ckpt_path, step, saved["log_dir"]) is not None:
            # The run continues in its own directory: its config.yaml stays, this command's config is kept beside it.
            self.save_config_kwargs.update(resumed_run=True, config_filename=f"config_resumed_step_{step}.yaml")

    def before_fit(self) -> None:
        fit = self.config["fit"]
        check_model_paths(self.model)
        check_output_paths(self.trainer, self.model, fit=True)  # not when the first checkpoint or export fails
        keep_last_checkpoint(self.trainer, fit["trainer"])
        # Read every data file (columns, encoding, characters, batch size) and check the validation cadence
        # against the batches of an epoch before any model is loaded or validated.
        preflight_data(self.datamodule, "fit", self.trainer.world_size)
        check_cadences(self.trainer, self.datamodule, self.trainer.world_size)
        # A resumed run validated its starting point already (and the weights are restored only inside fit).
        if fit.get("val_before_train", False) and self.trainer.limit_val_batches != 0 and not _resuming(self, fit):
            # Without a terminal ConsoleMetrics prints these values on the step-0 line; a terminal gets the table.
            with loggers_kept_open(self.trainer):
                self.trainer.validate(self.model, datamodule=self.datamodule, verbose=sys.stdout.isatty())

    def before_validate(self) -> None:
        check_model_paths(self.model)
        check_output_paths(self.trainer, self.model, fit=False)
        preflight_data(self.datamodule, "validate", self.trainer.world_size)
        quiet_checkpoint_restore()

    def before_test(self) -> None:
        check_model_paths(self.model)
        check_output_paths(self.trainer, self.model, fit=False)
        preflight_data(self.datamodule, "test", self.trainer.world_size)
        quiet_checkpoint_restore()


def check_model_paths(model: Any) -> None:
    """The policy's (and a PPO critic's) model directory, checked before anything is loaded."""
    try:
        path = getattr(model, "model_name_or_path", None)
        if path is not None:  # a packaged name is converted here (once), before any training starts
            check_model_dir(resolve_model_path(path), MODEL_PATH_SETTING)
        ppo = model.settings.ppo if hasattr(model, "settings") else None
        critic = ppo.critic_model_name_or_path if ppo is not None else None
        if critic is not None and not is_packaged_name(critic):
            check_model_dir(critic, "model.ppo.critic_model_name_or_path")
    except ValueError as err:
        raise SettingsError(str(err)) from err


def requeue_checkpoint(trainer_config: Any) -> Path | None:
    """The ``hpc_ckpt_<N>.ckpt`` a requeued SLURM job's ``fit`` will resume from (Lightning's rule), or None.

    Lightning resumes from the newest ``hpc_ckpt_<N>.ckpt`` of ``trainer.default_root_dir`` (the working
    directory when unset) whenever it runs under SLURM and ``--ckpt_path`` is not given; the command line
    treats it as that ``--ckpt_path``: the same settings checks, and the run continues in its own directory.
    """
    if not SLURMEnvironment.detect():
        return None
    return hpc_resume_path_in(trainer_config.get("default_root_dir") or os.getcwd())


def _resuming(cli: RFTCLI, fit: Any) -> bool:
    """``--ckpt_path`` given, or a SLURM requeue that Lightning will resume from an ``hpc_ckpt_N.ckpt``."""
    if fit.get("ckpt_path"):
        return True

    return SLURMEnvironment.detect() and hpc_resume_path(cli.trainer) is not None


# --------------------------------------------------------------------------- safety settings (issue 11)


#: Settings whose values are names in a registry; --help lists the names registered when the parser is built.
REGISTRY_SETTINGS: dict[str, Registry[Any]] = {
    "model.loss.policy_loss": POLICY_LOSSES,
    "model.advantages.estimator": ADVANTAGE_ESTIMATORS,
}


def document_registered_names(parser: Any) -> None:
    """Append the registered names to the ``--help`` text of each setting in :data:`REGISTRY_SETTINGS`."""
    for dest, registry in REGISTRY_SETTINGS.items():
        append_help(parser, dest, f"Registered: {', '.join(registry.names())}. Or your own: pkg.module:function.")


def add_safety_arguments(parser: Any) -> None:
    """Top-level flags of every subcommand that protect earlier runs and checkpoints."""
    parser.add_argument(
        "--overwrite_run",
        type=bool,
        default=False,
        help="reuse a logger version directory that holds a previous run (its config.yaml and export are replaced)",
    )
    parser.add_argument(
        "--resume_with_changes",
        type=bool,
        default=False,
        help="fit --ckpt_path: accept model/data settings that differ from the checkpoint's (listed in a warning)",
    )


def check_manual_optimization(trainer_config: Any) -> None:
    """Refuse the Trainer settings that manual optimization ignores (Lightning would raise only inside ``fit``)."""
    clip = trainer_config.get("gradient_clip_val")
    if clip is not None and clip > 0:
        raise SettingsError(
            "trainer.gradient_clip_val: lit_entropy steps the optimizer itself (manual optimization); clip with "
            f"model.optim.max_grad_norm and leave this null, got {clip}"
        )
    accumulate = trainer_config.get("accumulate_grad_batches")
    if accumulate is not None and accumulate != 1:
        raise SettingsError(
            "trainer.accumulate_grad_batches: lit_entropy accumulates micro-batches itself; set "
            f"model.update.micro_batch_size (and model.update.mini_batch_size) and leave this 1, got {accumulate}"
        )


def keep_last_checkpoint(trainer: Trainer, trainer_config: Any) -> None:
    """Give Lightning's default ModelCheckpoint ``save_last=True`` so ``<log_dir>/checkpoints/last.ckpt`` exists.

    Only when the config adds no ModelCheckpoint of its own (whose ``save_last`` is the user's choice).
    :class:`~lit_entropy.checkpointing.ResumableCheckpointing` refreshes ``last.ckpt`` at the end of
    ``fit``, so it holds the final step (and agrees with the exported model).
    """
    configured = trainer_config.get("callbacks") or []
    configured = configured if isinstance(configured, list) else [configured]
    if any("ModelCheckpoint" in str(_class_path(c)) for c in configured):
        return
    for callback in trainer.callbacks:  # type: ignore[attr-defined]  # Lightning sets Trainer.callbacks in a connector, unseen by its typing
        if type(callback) is ModelCheckpoint and not callback.save_last:
            callback.save_last = True


def _class_path(entry: Any) -> str:
    if isinstance(entry, str):
        return entry
    value = entry.get("class_path") if hasattr(entry, "get") else getattr(entry, "class_path", None)
    return str(value or type(entry).__name__)


# --------------------------------------------------------------------------- entry points


def check_legacy_arguments(args: list[str]) -> None:
    """Raise a ValueError naming today's key for any old ``model.*`` key in ``args`` or their config files."""
    given: dict[str, Any] = {}
    for index, arg in enumerate(args):
        key, _, value = arg.partition("=")
        value = value if value or index + 1 >= len(args) else args[index + 1]
        if key.startswith("--model."):
            *groups, name = key.removeprefix("--model.").split(".")
            node = given
            for group in groups:  # --model.update.epochs -> {"update": {"epochs": ...}}
                if not isinstance(node.get(group), dict):
                    node[group] = {}
                node = node[group]
            node[name] = value
        elif key in ("--config", "-c") and Path(value).is_file():
            model = (yaml.safe_load(Path(value).read_text()) or {}).get("model") or {}
            if isinstance(model, dict):
                check_legacy_model_keys(model.get("init_args", model), value)
    check_legacy_model_keys(given, "the command line")


def cli_main(args: ArgsType = None, run: bool = True) -> RFTCLI:
    """Build (and by default run) the CLI; ``args`` lets tests drive it in-process."""
    # --help documents every setting from its dataclass attribute docstring; reading those from the source of
    # every class costs two thirds of building the parser, so only a help request reads them.
    wants_help = any(
        str(arg) in ("-h", "--help") or str(arg).endswith(".help") for arg in command_line_words(args) or ()
    )
    set_parsing_settings(docstring_parse_attribute_docstrings=wants_help)
    return RFTCLI(
        RFTModule,
        PromptDataModule,
        args=args,
        run=run,
        trainer_defaults=TRAINER_DEFAULTS,
        parser_class=RFTArgumentParser,
        save_config_callback=RunDirectoryGuard,
        save_config_kwargs={"overwrite": False},
        auto_configure_optimizers=False,
        parser_kwargs={
            "prog": "lit-entropy",
            "description": _DESCRIPTION,
            "epilog": _EPILOG,
            "version": f"lit-entropy {__version__}",
        },
    )


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point (``lit-entropy fit|validate|test|export ...``).

    Settings errors and refused actions (:class:`SettingsError`, an export target that holds other files)
    print one line, ``lit-entropy: error: ...``, and exit with status 2; a user's reward function that fails
    during the run (:class:`~lit_entropy.rewards.RewardFunctionError`) prints one line and exits with status 1.
    A run stopped by a signal exits as shells expect of a process ended by it
    (:data:`~lit_entropy.cli.interrupts.INTERRUPTED_EXIT`): SIGTERM 143, Ctrl-C 130, after its resumable
    checkpoint and without validation or export.
    Set ``LIT_ENTROPY_TRACEBACK=1`` for the traceback.
    """
    from_command_line = argv is None
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv[:1] in (["--version"], ["-V"]):
            print(f"lit-entropy {__version__}")
            return
        if argv[:1] == ["export"]:
            export_main(argv[1:])
            return
        with interruption_exit_status():
            cli_main(None if from_command_line else argv)
    except (SettingsError, FileExistsError, RewardFunctionError, DiskFullError, PolicyDiverged) as err:
        if os.environ.get("LIT_ENTROPY_TRACEBACK"):
            raise
        message = err.strerror if isinstance(err, DiskFullError) else err  # without OSError's "[Errno 28]"
        print(f"lit-entropy: error: {message}", file=sys.stderr)
        raise SystemExit(2 if isinstance(err, (SettingsError, FileExistsError)) else 1) from None


if __name__ == "__main__":
    main()

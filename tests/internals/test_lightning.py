"""Pins lit_entropy.internals.lightning against the installed Lightning: a real fit, and the private state it reads."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning
import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment, SLURMEnvironment
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from lit_entropy.internals import lightning as internals

UPGRADE = f"(lightning {lightning.__version__}): update lit_entropy/internals/lightning.py"
STEPS = 3


class _Stateful:
    """An iterable with ``state_dict``/``load_state_dict``: Lightning saves and restores its position."""

    def __init__(self) -> None:
        self.position = 0
        self.loaded: dict[str, Any] | None = None

    def __iter__(self):
        while True:
            self.position += 1
            yield torch.zeros(1)

    def __len__(self) -> int:
        return 100

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.loaded = state


class _Probe(LightningModule):
    """Records, inside the fit, what the adapters answer and what Lightning really did."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[str, list[Any]] = {"attached": [], "step_in_batch": [], "step_at_batch_end": []}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen["attached"].append(internals.attached_trainer(self) is self.trainer)
        self.seen["step_in_batch"].append(internals.logger_step(self.trainer))
        self.log("probe", float(batch_idx), on_step=True)
        return (self.weight * batch).sum() + self.weight.square().sum()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.seen["step_at_batch_end"].append(internals.logger_step(self.trainer))

    def train_dataloader(self) -> Any:
        return _Stateful()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.fixture(scope="module")
def fitted(tmp_path_factory) -> tuple[Trainer, _Probe, Path, ModelCheckpoint]:
    root = tmp_path_factory.mktemp("fit")
    checkpoint = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=2, save_last=True)
    trainer = Trainer(
        default_root_dir=root, max_steps=STEPS, logger=CSVLogger(root), callbacks=[checkpoint],
        log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    module = _Probe()
    trainer.fit(module)
    return trainer, module, root, checkpoint


def test_attached_trainer_is_the_fitting_trainer_or_none(fitted) -> None:
    _, module, _, _ = fitted
    assert module.seen["attached"] == [True] * STEPS, f"attached_trainer is not the fitting Trainer {UPGRADE}"
    assert internals.attached_trainer(_Probe()) is None, f"an unattached module must answer None {UPGRADE}"
    with pytest.raises(RuntimeError):  # why the adapter exists: the public property raises instead
        _ = _Probe().trainer

    class Fake:
        trainer = "the fake's trainer"

    assert internals.attached_trainer(Fake()) == "the fake's trainer"
    assert internals.attached_trainer(object()) is None


def test_logger_step_is_the_step_the_logger_writes_the_batch_at(fitted) -> None:
    trainer, module, root, _ = fitted
    assert module.seen["step_in_batch"] == list(range(STEPS)), f"logger step inside batch i must be i {UPGRADE}"
    assert module.seen["step_at_batch_end"] == list(range(STEPS)), f"it must not advance before batch end {UPGRADE}"
    assert internals.logger_step(trainer) == STEPS
    import csv

    rows = list(csv.DictReader(open(next(root.rglob("metrics.csv")))))
    written = {int(float(r["probe"])): int(r["step"]) for r in rows if r.get("probe")}
    assert written == {i: i for i in range(STEPS)}, f"CSVLogger steps {written} != logger_step {UPGRADE}"


def test_checkpoint_keys_that_rewinding_edits(fitted, tmp_path) -> None:
    trainer, _, _, _ = fitted
    path = tmp_path / "probe.ckpt"
    trainer.save_checkpoint(path)
    checkpoint = torch.load(path, weights_only=False)
    epoch_loop = checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"]
    assert epoch_loop.get(internals.LOGGER_STEP_KEY) == STEPS, f"checkpoint no longer holds the logger step {UPGRADE}"
    states = internals.saved_loader_states(checkpoint)
    assert states == [{"position": STEPS}], f"the training loader's state_dict moved {UPGRADE}"
    internals.rewind_logger_step(checkpoint)
    assert checkpoint["loops"]["fit_loop"]["epoch_loop.state_dict"][internals.LOGGER_STEP_KEY] == STEPS - 1
    assert internals.saved_loader_states(checkpoint) is states, "saved_loader_states must return the list itself"
    internals.rewind_logger_step({})  # no loops (a weights-only checkpoint): nothing to do


def test_pending_loader_states_reach_the_loader(fitted) -> None:
    trainer, _, _, _ = fitted
    fit_loop = trainer.fit_loop
    loader = _Stateful()
    saved = (fit_loop._combined_loader, fit_loop._combined_loader_states_to_load)
    try:
        fit_loop._combined_loader = CombinedLoader([loader], "max_size_cycle")
        fit_loop._combined_loader_states_to_load = [{"position": 7}]
        assert internals.load_pending_loader_states(trainer)
        assert loader.loaded == {"position": 7}, f"pending loader states were not applied {UPGRADE}"
        assert not internals.load_pending_loader_states(trainer), "the pending states must be cleared once applied"
    finally:
        fit_loop._combined_loader, fit_loop._combined_loader_states_to_load = saved


def test_hpc_checkpoint_paths(tmp_path) -> None:
    trainer = Trainer(default_root_dir=tmp_path, logger=False, accelerator="cpu", devices=1)
    assert internals.hpc_resume_path(trainer) is None
    assert internals.hpc_checkpoint_path(trainer) == tmp_path / "hpc_ckpt_1.ckpt", f"HPC save path moved {UPGRADE}"
    (tmp_path / "hpc_ckpt_1.ckpt").write_bytes(b"")
    assert internals.hpc_checkpoint_path(trainer) == tmp_path / "hpc_ckpt_2.ckpt"
    assert internals.hpc_resume_path(trainer) == str(tmp_path / "hpc_ckpt_1.ckpt"), f"HPC resume path {UPGRADE}"
    assert internals.hpc_resume_path_in(tmp_path) == tmp_path / "hpc_ckpt_1.ckpt", f"HPC resume path {UPGRADE}"
    (tmp_path / "hpc_ckpt_12.ckpt").write_bytes(b"")
    assert internals.hpc_resume_path(trainer) == str(tmp_path / "hpc_ckpt_12.ckpt")  # by number, not by name
    assert internals.hpc_resume_path_in(tmp_path) == tmp_path / "hpc_ckpt_12.ckpt"
    assert internals.hpc_resume_path_in(tmp_path / "missing") is None


def test_cluster_environment_of_a_single_device_trainer() -> None:
    slurm = SLURMEnvironment(auto_requeue=True)
    trainer = Trainer(plugins=[slurm], logger=False, accelerator="cpu", devices=1)
    assert internals.cluster_environment(trainer) is slurm, f"cluster environment not found {UPGRADE}"
    plain = Trainer(logger=False, accelerator="cpu", devices=1)
    assert isinstance(internals.cluster_environment(plain), LightningEnvironment)


def test_model_checkpoint_last_saved_step(fitted) -> None:
    trainer, _, _, checkpoint = fitted
    assert internals.last_saved_step(ModelCheckpoint()) == 0, f"a fresh ModelCheckpoint's saved step {UPGRADE}"
    assert internals.last_saved_step(checkpoint) == 2, f"ModelCheckpoint saved at step 2 (every 2 steps) {UPGRADE}"
    fresh = ModelCheckpoint(dirpath=trainer.default_root_dir, save_last=True)
    internals.mark_saved_step(fresh, 5)
    assert internals.last_saved_step(fresh) == 5


def test_callback_state_key_format() -> None:
    from lightning.pytorch import Callback

    class Probe(Callback):
        pass

    key = internals.callback_state_key(Probe(), mu=1.0, method="clip_b")
    expected = "test_callback_state_key_format.<locals>.Probe{'mu': 1.0, 'method': 'clip_b'}"
    assert key == expected, f"state keys changed format: checkpoints' callback states would not load {UPGRADE}"


def test_add_subcommand_parsers_builds_only_the_named_subcommands(capsys):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.demos.boring_classes import BoringModel

    class OnlyFit(LightningCLI):
        def _add_subcommands(self, parser: Any, **kwargs: Any) -> None:
            internals.add_subcommand_parsers(self, parser, {"fit": "train the boring model"}, **kwargs)

    with pytest.raises(SystemExit) as exit_info:
        OnlyFit(BoringModel, args=["--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0 and "train the boring model" in out and "validate" not in out, UPGRADE
    with pytest.raises(SystemExit):
        OnlyFit(BoringModel, args=["fit", "--help"])
    assert "--trainer.max_steps" in capsys.readouterr().out, UPGRADE


class _EvenBatches(LightningModule):
    """Logs ``even`` on even batches only; with ``forget`` the step values are forgotten when a batch starts."""

    def __init__(self, forget: bool) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.forget = forget
        self.batch_values: list[dict[str, float]] = []

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        if self.forget:
            internals.forget_step_values(self.trainer)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if batch_idx % 2 == 0:
            self.log("even", float(batch_idx), on_step=True)
        return (self.weight * batch).sum()

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.batch_values.append({k: float(v) for k, v in internals.batch_step_values(self.trainer).items()})

    def train_dataloader(self) -> Any:
        return _Stateful()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("forget", [False, True])
def test_forget_step_values_keeps_a_batch_from_repeating_earlier_values(forget: bool, tmp_path) -> None:
    """Lightning writes at every batch the last value of each key logged earlier in the epoch; after
    ``forget_step_values`` a batch writes only what it logged."""
    written: list[tuple[int, dict[str, float]]] = []
    logger = CSVLogger(tmp_path)
    logger.log_metrics = lambda metrics, step=None: written.append((step, dict(metrics)))  # type: ignore[method-assign]
    trainer = Trainer(
        max_steps=4, logger=logger, log_every_n_steps=1, enable_progress_bar=False, enable_model_summary=False,
        enable_checkpointing=False, accelerator="cpu", devices=1,
    )  # fmt: skip
    module = _EvenBatches(forget)
    trainer.fit(module)
    evens = [(step, metrics["even"]) for step, metrics in written if "even" in metrics]
    if forget:
        assert evens == [(0, 0.0), (2, 2.0)], UPGRADE
        assert module.batch_values == [{"even": 0.0}, {}, {"even": 2.0}, {}], UPGRADE
    else:  # what the adapter exists for: the value of batch 0 written again at batch 1
        assert evens == [(0, 0.0), (1, 0.0), (2, 2.0), (3, 2.0)], UPGRADE


def test_logger_version_adapters_and_the_cli_subcommand_runner(tmp_path, monkeypatch):
    from lightning.pytorch.cli import LightningCLI
    from lightning.pytorch.loggers import TensorBoardLogger

    logger = TensorBoardLogger(save_dir=str(tmp_path), name="x")
    assert internals.logger_version_if_set(logger) is None, UPGRADE
    (tmp_path / "x" / "version_3").mkdir(parents=True)
    assert internals.next_logger_version(logger) == 4, UPGRADE
    assert internals.logger_version_if_set(logger) is None  # not picked by asking
    internals.set_logger_version(logger, 7)
    assert logger.version == 7 and logger.log_dir == str(tmp_path / "x" / "version_7"), UPGRADE
    assert internals.logger_experiment_if_open(logger) is None
    logger.experiment  # noqa: B018  (creates the writer)
    assert internals.logger_experiment_if_open(logger) is logger.experiment, UPGRADE
    logger.finalize("success")
    for name in ("RANK", "LOCAL_RANK", "SLURM_PROCID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert internals.process_rank() == 0
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert internals.process_rank() == 1, UPGRADE
    calls = []

    class Recording:
        trainer = type("Trainer", (), {"fit": None})()

        def before_fit(self):
            calls.append("before")

        def fit(self, **kwargs):
            calls.append("fit")

        def _prepare_subcommand_kwargs(self, subcommand):
            return {}

    assert hasattr(LightningCLI, "_run_subcommand"), UPGRADE
    internals.run_cli_subcommand(Recording(), "fit")
    assert calls == ["before", "fit"], UPGRADE

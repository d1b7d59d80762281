"""Exact resume: a run stopped after step k and resumed equals the uninterrupted run; atomic writes; HF export."""

from __future__ import annotations

import importlib.util
import os
import signal
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger

from lit_entropy.callbacks import EntropyDiscriminatorClipping
from lit_entropy.checkpointing import AtomicCheckpointIO, RunInterrupted
from lit_entropy.cli import export_main
from lit_entropy.data.datamodule import PromptDataModule
from lit_entropy.internals.lightning import logger_step
from lit_entropy.module import RFTModule
from lit_entropy.rollout import HFRolloutEngine, SamplingConfig
from lit_entropy.settings import (
    EvaluationConfig,
    LoggingConfig,
    OptimConfig,
    PolicyConfig,
    UpdateConfig,
)

BATCHES = 4  # k + n
STOP_AFTER = 2  # k
UPDATES_PER_BATCH = 4  # ppo_epochs=2 x (16 rows / mini_batch_size 8)


def digit_reward(completions: list[str], answers: list[str]) -> list[float]:
    """A reward that varies across samples of a random tiny model (exact match would be all zeros)."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


class Recorder(Callback):
    """Logged ``train/*`` values after each batch, keyed by the batch's 1-based index in the epoch."""

    def __init__(self) -> None:
        self.rows: dict[int, dict[str, float]] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        metrics = trainer.callback_metrics
        self.rows[batch_idx + 1] = {k: float(v) for k, v in metrics.items() if k.startswith("train/")}
        self.rows[batch_idx + 1]["global_step"] = float(trainer.global_step)
        self.rows[batch_idx + 1]["prompt_sum"] = float(batch["input_ids"].sum())
        # the step the logger writes this batch's metrics at
        self.rows[batch_idx + 1]["log_step"] = float(logger_step(trainer))


class StopAfter(Callback):
    """Stops the fit at the end of batch ``batches`` (a stop that, unlike ``max_steps``, leaves the LR schedule
    sized for the whole run: ``max_steps`` counts optimizer steps and is the schedule's horizon when set)."""

    def __init__(self, batches: int) -> None:
        self.batches = batches

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if batch_idx + 1 == self.batches:
            trainer.should_stop = True


def _module(model_dir: str, **extra) -> RFTModule:
    settings = dict(
        sampling=SamplingConfig(num_samples=4, max_new_tokens=4),
        update=UpdateConfig(epochs=2, mini_batch_size=8),
        optim=OptimConfig(lr=1e-2, lr_schedule="cosine", warmup_steps=3),
        evaluation=EvaluationConfig(num_samples=2),
        logging=LoggingConfig(export_on_train_end=False),
    )
    module = RFTModule(PolicyConfig(model_dir), **{**settings, **extra})
    module.reward_fn = digit_reward
    return module


def _fit(model_dir, root: Path, *, max_steps=-1, ckpt_path=None, module=None, recorder=None, callbacks=(), logger=None):
    seed_everything(0)
    module = module if module is not None else _module(model_dir)
    recorder = recorder if recorder is not None else Recorder()
    data = PromptDataModule(tokenizer_name_or_path=model_dir, batch_size=4, num_train_examples=32, seed=3)
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=1,
        max_steps=max_steps,
        limit_train_batches=BATCHES,
        limit_val_batches=1,  # validation between batches must not shift the training RNG stream
        val_check_interval=STOP_AFTER,
        logger=logger or False,
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[recorder, EntropyDiscriminatorClipping("clip_b", mu=0.5), *callbacks],
    )
    try:
        trainer.fit(module, data, ckpt_path=ckpt_path)
    except RunInterrupted as stop:  # a signal: the checkpoint is written, no validation or export follows
        trainer.interruption = stop
    return module, trainer, recorder


def _weights(module: RFTModule) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.policy.state_dict().items()}


@pytest.fixture(scope="module")
def uninterrupted(tiny_model_dir, tmp_path_factory):
    module, trainer, recorder = _fit(tiny_model_dir, tmp_path_factory.mktemp("full"))
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    return _weights(module), recorder.rows, trainer


def _assert_same_tail(rows: dict[int, dict[str, float]], reference: dict[int, dict[str, float]]) -> None:
    assert sorted(rows) == list(range(STOP_AFTER + 1, BATCHES + 1))
    for batch in rows:
        assert rows[batch].keys() == reference[batch].keys()
        for key, value in reference[batch].items():
            assert rows[batch][key] == pytest.approx(value, rel=1e-6, abs=1e-7), (batch, key)


def test_stop_after_k_steps_and_resume_equals_the_uninterrupted_run(tiny_model_dir, tmp_path, uninterrupted):
    weights, reference, _ = uninterrupted
    # Sanity: the run is not trivial (rewards vary, the policy moved, prompts are shuffled).
    assert any(row["train/reward/std"] > 0 for row in reference.values())
    assert len({row["prompt_sum"] for row in reference.values()}) == BATCHES

    # Stop after k batches; the periodic checkpoint is written at the end of batch k (on_train_batch_end).
    every = ModelCheckpoint(tmp_path / "a", filename="stopped", every_n_train_steps=STOP_AFTER * UPDATES_PER_BATCH)
    _, _, first = _fit(tiny_model_dir, tmp_path / "a", callbacks=[every, StopAfter(STOP_AFTER)])
    assert sorted(first.rows) == list(range(1, STOP_AFTER + 1))
    assert first.rows[STOP_AFTER] == pytest.approx(reference[STOP_AFTER])
    ckpt = tmp_path / "a" / "stopped.ckpt"
    assert not any(k.startswith("ref_model.") for k in torch.load(ckpt, weights_only=True)["state_dict"])

    module_b, trainer_b, resumed = _fit(tiny_model_dir, tmp_path / "d", ckpt_path=ckpt)
    assert trainer_b.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(module_b), weights, rtol=0, atol=0)


class InterruptAt(HFRolloutEngine):
    """HF sampling that raises KeyboardInterrupt (as Ctrl-C would) on the ``at``-th training rollout."""

    def __init__(self, at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.at = at
        self.calls = 0

    def generate(self, policy, input_ids, attention_mask, sampling):
        self.calls += policy.training  # validation rollouts run in eval mode
        if policy.training and self.calls == self.at:
            raise KeyboardInterrupt
        return super().generate(policy, input_ids, attention_mask, sampling)


def test_ctrl_c_writes_a_checkpoint_that_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted):
    weights, reference, _ = uninterrupted
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    engine = InterruptAt(STOP_AFTER + 1, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    previous = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit):  # Lightning exits after a graceful shutdown on KeyboardInterrupt
            _fit(tiny_model_dir, tmp_path / "run", module=_module(tiny_model_dir, rollout=engine))
    finally:
        signal.signal(signal.SIGINT, previous)  # Lightning ignores SIGINT after the first one
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    assert path.is_file()
    module, trainer, resumed = _fit(tiny_model_dir, tmp_path / "resume", ckpt_path=path)
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)


def test_a_failed_write_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    io = AtomicCheckpointIO()
    path = tmp_path / "ckpts" / "last.ckpt"
    io.save_checkpoint({"step": torch.tensor(1)}, path)
    assert torch.load(path, weights_only=True)["step"] == 1

    real_save = torch.save

    def crash_midway(obj, f, *args, **kwargs):
        f.write(b"partial bytes of a new checkpoint")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", crash_midway)
    with pytest.raises(OSError, match="disk full"):
        io.save_checkpoint({"step": torch.tensor(2)}, path)
    monkeypatch.setattr(torch, "save", real_save)
    assert torch.load(path, weights_only=True)["step"] == 1
    assert os.listdir(path.parent) == ["last.ckpt"]  # the temp file was removed

    io.save_checkpoint({"step": torch.tensor(3)}, path)
    assert torch.load(path, weights_only=True)["step"] == 3


def test_fit_exports_a_transformers_loadable_policy(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    module = _module(tiny_model_dir, logging=LoggingConfig(export_on_train_end=True))
    logger = TensorBoardLogger(tmp_path, name="run", default_hp_metric=False)
    module, trainer, _ = _fit(tiny_model_dir, tmp_path, module=module, max_steps=UPDATES_PER_BATCH, logger=logger)
    assert isinstance(trainer.strategy.checkpoint_io, AtomicCheckpointIO)
    export = Path(module.export_path)
    assert export == tmp_path / "run" / "version_0" / "hf_model"
    loaded = AutoModelForCausalLM.from_pretrained(export).eval()
    tok = AutoTokenizer.from_pretrained(export)
    assert loaded.config.architectures == ["Qwen2ForCausalLM"]
    ids = tok(["12+7=", "3-4="], return_tensors="pt", padding=True)
    policy = module.policy.eval()
    with torch.no_grad():
        torch.testing.assert_close(loaded(**ids).logits, policy(**ids).logits)
    # the export is not the initial model: training moved the weights
    initial = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert not torch.equal(initial.model.layers[0].mlp.up_proj.weight, loaded.model.layers[0].mlp.up_proj.weight)

    # on request, from a checkpoint: `lit-entropy export --ckpt_path ... --out ...`
    trainer.save_checkpoint(tmp_path / "final.ckpt")
    out = export_main(["--ckpt_path", str(tmp_path / "final.ckpt"), "--out", str(tmp_path / "from_ckpt")])
    again = AutoModelForCausalLM.from_pretrained(out)
    torch.testing.assert_close(again.state_dict(), loaded.state_dict(), rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(out)("12+7=")["input_ids"] == tok("12+7=")["input_ids"]


# ---------------------------------------------------------------------------- the resumable sampler
def _loader(n: int, batch: int, replicas: int = 1, rank: int = 0, shuffle: bool = True, seed: int = 5):
    from lit_entropy.data.sampler import ResumableDataLoader, ResumableDistributedSampler

    data = list(range(n))
    sampler = ResumableDistributedSampler(
        data, num_replicas=replicas, rank=rank, shuffle=shuffle, seed=seed, drop_last=True
    )
    return ResumableDataLoader(
        data, batch_size=batch, sampler=sampler, drop_last=True, generator=torch.Generator().manual_seed(0)
    )


def _epoch(loader, epoch: int) -> list[list[int]]:
    loader.sampler.set_epoch(epoch)
    return [b.tolist() for b in loader]


def test_ranks_together_see_the_single_process_batches():
    """Rank r takes every R-th index of the seeded permutation: step i of R ranks with batch B covers the
    same prompts as step i of one process with batch R*B."""
    perm = torch.randperm(24, generator=torch.Generator().manual_seed(5 + 1)).tolist()  # DistributedSampler
    single = _epoch(_loader(24, 6), 1)
    assert [x for b in single for x in b] == perm
    ranks = [_epoch(_loader(24, 2, replicas=3, rank=r), 1) for r in range(3)]
    for step, batch in enumerate(single):
        assert sorted(x for r in range(3) for x in ranks[r][step]) == sorted(batch)
    assert _epoch(_loader(24, 6, shuffle=False), 0)[1] == [6, 7, 8, 9, 10, 11]


def test_loader_state_skips_consumed_batches_of_the_same_epoch_only():
    loader = _loader(20, 4)
    full = _epoch(loader, 2)
    loader.sampler.set_epoch(2)
    iterator = iter(loader)
    seen = [next(iterator).tolist(), next(iterator).tolist()]
    state = loader.state_dict()
    assert state == {"epoch": 2, "batches": 2, "batch_size": 4, "num_replicas": 1}

    fresh = _loader(20, 4)
    fresh.load_state_dict(state)
    assert seen + _epoch(fresh, 2) == full  # resumed mid-epoch: the remaining batches, in order
    assert _epoch(fresh, 3) == _epoch(_loader(20, 4), 3)  # the next epoch starts from its beginning

    other_epoch = _loader(20, 4)
    other_epoch.load_state_dict(state)
    assert _epoch(other_epoch, 3) == _epoch(_loader(20, 4), 3)  # a state of epoch 2 does not cut epoch 3

    # 2 ranks x batch 2 after 8 prompts of one process with batch 4: both continue at prompt 8
    halves = []
    for rank in range(2):
        resumed = _loader(20, 2, replicas=2, rank=rank)
        resumed.load_state_dict(state)
        halves += [x for b in _epoch(resumed, 2) for x in b]
    assert sorted(halves) == sorted(x for b in full[2:] for x in b)


def test_plain_iteration_reshuffles_each_pass():
    loader = _loader(12, 4)
    first, second = [[b.tolist() for b in loader] for _ in range(2)]
    assert first != second and sorted(sum(first, [])) == sorted(sum(second, [])) == list(range(12))


def test_sharded_checkpoint_writes_are_atomic(tiny_model_dir, tmp_path, monkeypatch):
    """save_distributed_checkpoint=True: a crash while writing leaves the previous sharded checkpoint whole."""
    import lightning.pytorch.strategies.model_parallel as model_parallel
    from lightning.pytorch import Trainer

    from lit_entropy.distributed.fsdp2 import FSDP2Strategy

    module = RFTModule(
        PolicyConfig(tiny_model_dir),
        sampling=SamplingConfig(num_samples=2, max_new_tokens=3),
        logging=LoggingConfig(export_on_train_end=False),
    )
    data = PromptDataModule(tokenizer_name_or_path=tiny_model_dir, batch_size=2, num_train_examples=8)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        strategy=FSDP2Strategy(save_distributed_checkpoint=True),
        max_steps=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(module, data)
    path = tmp_path / "sharded.ckpt"
    trainer.save_checkpoint(path)
    before = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert before and path.is_dir()

    def crash(state, directory):
        (directory / "__0_0.distcp").write_bytes(b"half a shard")  # a partial write, then the failure
        raise OSError("disk full")

    monkeypatch.setattr(model_parallel, "_distributed_checkpoint_save", crash)
    with pytest.raises(OSError, match="disk full"):
        trainer.save_checkpoint(path)
    after = {p.relative_to(path): p.read_bytes() for p in path.rglob("*") if p.is_file()}
    assert after == before
    monkeypatch.undo()
    trainer.save_checkpoint(path)  # a later save replaces it and cleans the leftover temp directory
    assert path.is_dir() and not [p for p in tmp_path.iterdir() if p.name.startswith(".lit_entropy")]


# ---------------------------------------------------------------------------- preemption (issue 11)
class SignalAt(HFRolloutEngine):
    """HF sampling that sends ``signum`` to this process (as a scheduler would) in the ``at``-th training rollout."""

    def __init__(self, signum: int, at: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.signum = signum
        self.at = at
        self.calls = 0

    def generate(self, policy, input_ids, attention_mask, sampling):
        self.calls += policy.training
        if policy.training and self.calls == self.at:
            os.kill(os.getpid(), self.signum)
        return super().generate(policy, input_ids, attention_mask, sampling)


def _signal_engine(model_dir: str, signum: int) -> SignalAt:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    return SignalAt(signum, STOP_AFTER, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)


def test_sigterm_writes_a_checkpoint_that_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted):
    """SIGTERM mid-batch: the batch finishes, interrupted.ckpt is written, the run stops; resuming equals the
    uninterrupted run (metrics and bit-identical weights)."""
    weights, reference, _ = uninterrupted
    previous = signal.getsignal(signal.SIGTERM)
    engine = _signal_engine(tiny_model_dir, signal.SIGTERM)
    _, trainer, first = _fit(tiny_model_dir, tmp_path / "run", module=_module(tiny_model_dir, rollout=engine))
    assert signal.getsignal(signal.SIGTERM) == previous  # handlers restored after training
    assert sorted(first.rows) == list(range(1, STOP_AFTER + 1)), "stopped at the end of the signalled batch"
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    assert path.is_file() and trainer.global_step == STOP_AFTER * UPDATES_PER_BATCH
    assert trainer.interruption.code == 143 and trainer.interruption.path == path  # no validation, no export
    module, trainer, resumed = _fit(tiny_model_dir, tmp_path / "resume", ckpt_path=path)
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)


def test_slurm_requeue_signal_saves_an_hpc_checkpoint_requeues_and_the_requeued_job_resumes(
    tiny_model_dir, tmp_path, uninterrupted, monkeypatch
):
    """Under Lightning's SLURMEnvironment(auto_requeue=True): SIGUSR1 -> hpc_ckpt_1.ckpt + `scontrol requeue <job>`;
    the requeued job (same command, no --ckpt_path) resumes from it exactly."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    weights, reference, _ = uninterrupted
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "scontrol_calls.txt"
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    for key, value in {
        "SLURM_NTASKS": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_JOB_NAME": "grpo",
        "SLURM_JOB_ID": "4242",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "localhost",
    }.items():
        monkeypatch.setenv(key, value)
    assert SLURMEnvironment.detect()
    root = tmp_path / "job"
    engine = _signal_engine(tiny_model_dir, signal.SIGUSR1)
    previous = signal.getsignal(signal.SIGUSR1)
    _, trainer, first = _fit(tiny_model_dir, root, module=_module(tiny_model_dir, rollout=engine))
    assert isinstance(trainer._accelerator_connector.cluster_environment, SLURMEnvironment)
    assert signal.getsignal(signal.SIGUSR1) == previous
    assert sorted(first.rows) == list(range(1, STOP_AFTER + 1))
    assert (root / "hpc_ckpt_1.ckpt").is_file()
    assert calls.read_text().split() == ["requeue", "4242"]
    assert trainer.interruption.code == 128 + signal.SIGUSR1  # stopped: neither validation nor export follows
    module, trainer, resumed = _fit(tiny_model_dir, root)  # the requeued job: no ckpt_path
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)


# ---------------------------------------------------------------------------- LoRA policies (issue 25)
needs_peft = pytest.mark.skipif(
    importlib.util.find_spec("peft") is None,
    reason="needs the lora extra (pip install 'lit-entropy[lora]')",
)


def _lora_module(model_dir: str, **extra) -> RFTModule:
    """LoRA adapters with a KL term (reference = adapters off); its checkpoints hold adapters and optimizer state."""
    module = _module(model_dir, **extra)
    settings = dict(module.settings.to_hparams(), policy={"model_name_or_path": model_dir, "lora": {"r": 4}})
    settings["loss"] = dict(settings["loss"], kl_coef=0.1)
    lora = RFTModule(**settings, rollout=extra.get("rollout"))
    lora.reward_fn = digit_reward
    return lora


@pytest.fixture(scope="module")
def uninterrupted_lora(tiny_model_dir, tmp_path_factory):
    module, trainer, recorder = _fit(
        tiny_model_dir, tmp_path_factory.mktemp("lora"), module=_lora_module(tiny_model_dir)
    )
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    return _weights(module), recorder.rows


@needs_peft
def test_lora_checkpoint_holds_adapters_and_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted_lora):
    weights, reference = uninterrupted_lora
    assert any(row["train/loss/kl"] > 0 for row in reference.values())  # the adapters-off reference is in use
    every = ModelCheckpoint(tmp_path / "a", filename="stopped", every_n_train_steps=STOP_AFTER * UPDATES_PER_BATCH)
    module = _lora_module(tiny_model_dir)
    _fit(tiny_model_dir, tmp_path / "a", callbacks=[every, StopAfter(STOP_AFTER)], module=module)
    checkpoint = torch.load(tmp_path / "a" / "stopped.ckpt", weights_only=True)
    adapters = {f"policy.{k}" for k, p in module.policy.named_parameters() if p.requires_grad}
    assert set(checkpoint["state_dict"]) == adapters  # not the frozen base
    saved = checkpoint["optimizer_states"][0]["state"]
    assert len(saved) == len(adapters) and all("exp_avg" in s for s in saved.values())
    resumed_module, trainer, resumed = _fit(
        tiny_model_dir, tmp_path / "b", ckpt_path=tmp_path / "a" / "stopped.ckpt", module=_lora_module(tiny_model_dir)
    )
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(resumed_module), weights, rtol=0, atol=0)


@needs_peft
def test_lora_sigterm_checkpoint_resumes_exactly(tiny_model_dir, tmp_path, uninterrupted_lora):
    weights, reference = uninterrupted_lora
    engine = _signal_engine(tiny_model_dir, signal.SIGTERM)
    _, trainer, first = _fit(tiny_model_dir, tmp_path / "run", module=_lora_module(tiny_model_dir, rollout=engine))
    assert sorted(first.rows) == list(range(1, STOP_AFTER + 1))
    path = tmp_path / "run" / "checkpoints" / "interrupted.ckpt"
    assert all("lora_" in k for k in torch.load(path, weights_only=True)["state_dict"])
    module, trainer, resumed = _fit(
        tiny_model_dir, tmp_path / "resume", ckpt_path=path, module=_lora_module(tiny_model_dir)
    )
    assert trainer.global_step == BATCHES * UPDATES_PER_BATCH
    _assert_same_tail(resumed.rows, reference)
    torch.testing.assert_close(_weights(module), weights, rtol=0, atol=0)

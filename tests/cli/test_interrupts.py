"""Issue 35 §1: SIGTERM and Ctrl-C end a ``lit-entropy fit`` alike: checkpoint, no validation or export, 143 / 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: A run long enough to be signalled after its first step line, with no validation before the end.
COMMAND = [
    sys.executable,
    "-m",
    "lit_entropy",
    "fit",
    "--config",
    str(ROOT / "configs" / "grpo_tiny.yaml"),
    "--trainer.max_steps=40",
    "--trainer.val_check_interval=40",
    "--data.num_train_examples=640",
    "--data.num_val_examples=8",
    "--data.val_batch_size=8",
    "--val_before_train=false",
]


def _signalled_run(tmp_path: Path, signum: int) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run the command, send ``signum`` once it printed ``step 1``; returns the result and the stdout lines."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    child = subprocess.Popen(COMMAND, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    for line in child.stdout:
        lines.append(line.rstrip("\n"))
        if line.startswith("step 1 "):
            child.send_signal(signum)
            break
    out, err = child.communicate(timeout=600)
    lines += out.splitlines()
    return subprocess.CompletedProcess(COMMAND, child.returncode, "\n".join(lines), err), lines


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_writes_the_checkpoint_skips_validation_and_export_and_exits_non_zero(tmp_path, signum, status):
    result, lines = _signalled_run(tmp_path, signum)
    assert result.returncode == status, result.stderr[-3000:]
    run = tmp_path / "runs" / "grpo_tiny" / "version_0"
    checkpoint = run / "checkpoints" / "interrupted.ckpt"
    assert checkpoint.is_file()
    assert not (run / "hf_model").exists(), "a half-trained policy must not be exported"
    assert not any("val/" in line for line in lines), "no validation after the interrupt"
    name = signal.Signals(signum).name
    hint = (
        f"lit_entropy: interrupted by {name}; resumable checkpoint written to {checkpoint.relative_to(tmp_path)}; "
        f"no validation or export. Resume with: lit-entropy fit --config {(run / 'config.yaml').relative_to(tmp_path)}"
        f" --ckpt_path {checkpoint.relative_to(tmp_path)}"
    )
    assert result.stderr.rstrip().splitlines()[-1] == hint, result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "weights_only" not in result.stderr
    if signum == signal.SIGTERM:  # the signalled batch finishes: its line is printed and its scalars logged
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

        assert [line.split(" | ")[0] for line in lines] == ["step 0", "step 1", "step 2"]
        events = EventAccumulator(str(run), size_guidance={"scalars": 0})
        events.Reload()
        assert [e.step for e in events.Scalars("train/reward/mean")] == [0, 1, 2]


def test_signals_outside_the_training_loop_exit_with_the_signal_status_and_one_line(capsys):
    """Lightning ends a SIGTERM during a validation (the step-0 one) with a SystemExit of status 0 and a Ctrl-C
    with sys.exit(1); a Ctrl-C while the model loads is a bare KeyboardInterrupt."""
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lit_entropy.checkpointing.callback import RunInterrupted, _record
    from lit_entropy.cli.interrupts import interruption_exit_status

    def status(raised: BaseException, record: RunInterrupted | None = None) -> int:
        with pytest.raises(SystemExit) as exit_info, interruption_exit_status():
            if record is not None:
                _record(record)
            raise raised
        return exit_info.value.code

    assert status(SIGTERMException()) == 143
    assert status(KeyboardInterrupt()) == 130
    assert status(SystemExit(1), RunInterrupted(signal.SIGINT, None)) == 130
    assert status(SystemExit(1), RunInterrupted(signal.SIGINT, Path("x.ckpt"))) == 130
    assert status(SystemExit(1)) == 1  # not an interruption: left alone
    lines = capsys.readouterr().err.splitlines()
    assert lines == [
        "lit-entropy: interrupted by SIGTERM before the first training step; nothing to resume",
        "lit-entropy: interrupted by SIGINT before the first training step; nothing to resume",
        "lit-entropy: interrupted by SIGINT before the first training step; nothing to resume",
    ]

"""Issue 21 §2: what a default ``lit-entropy fit`` prints: step lines that tell the truth, no preventable warning."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]

#: Lines a run must not print: warnings (Python's and Lightning's ``file.py:line: message`` form) and the
#: Lightning noise lit_entropy silences or replaces.
NOISE = (
    r"Warning\b",
    r"\.py:\d+: ",
    r"deprecated",
    r"💡 Tip",
    r"will override existing callbacks",
    r"FLOPs",
    r"weights_only",
    r"The dirpath has changed",
    r"Loading `train_dataloader` to estimate",
    # progress bars off a terminal (issue 35 §7): the step lines replace them
    r"Loading weights",
    r"Writing model shards",
    r"it/s",
    r"v_num",
    r"━",
    r"^\s*Epoch \d",
    r"^Validation",
    r"litlogger",
    r"^\s+[\w/@]+: [-\d.]+\s*$",  # the bar's metrics block
)


def test_a_default_tiny_fit_prints_aligned_step_lines_and_no_preventable_warning(tmp_path):
    command = [sys.executable, "-m", "lit_entropy", "fit", "--config", str(ROOT / "configs" / "grpo_tiny.yaml")]
    command += ["--trainer.max_steps=3", "--trainer.val_check_interval=3", "--data.num_train_examples=48"]
    command += ["--data.num_val_examples=8", "--data.val_batch_size=8"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    found = [line for line in output.splitlines() if any(re.search(pattern, line) for pattern in NOISE)]
    assert not found, "\n".join(found)

    lines = [line for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [line.split(" | ")[0] for line in lines] == ["step 0", "step 1", "step 2", "step 3"]
    # validation before training on the step-0 line, the final one (after 3 batches) on a line of its own
    assert [i for i, line in enumerate(lines) if "val/avg@8" in line] == [0, 3]
    assert lines[3].startswith("step 3 | val/avg@8 ") and "reward" not in lines[3]
    assert "Validate metric" not in result.stdout  # the step-0 line carries those values
    assert "lit_entropy: 298 K parameters, 298 K trainable (policy: Qwen2ForCausalLM)" in result.stderr

"""docs/extending.md's "your own Lightning module" example runs as written, with the alignment and temperature."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "docs" / "extending.md"
SECTION = "## Entropy-discriminator clipping in your own Lightning module"


def _example_code() -> str:
    text = README.read_text()
    start = text.index("```python\n", text.index(SECTION)) + len("```python\n")
    return text[start : text.index("```\n", start)]


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The namespace left by executing the README block (it builds a tiny model and fits 4 batches)."""
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    cwd, threads = Path.cwd(), torch.get_num_threads()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    # Run where nothing of the repository can be overwritten.
    os.chdir(tmp_path_factory.mktemp("readme"))
    try:
        exec(compile(_example_code(), str(README), "exec"), namespace)
    finally:
        os.chdir(cwd)
        torch.set_num_threads(threads)
    return namespace


def test_example_fits_and_logs_the_metrics(example: dict[str, Any]) -> None:
    trainer = example["trainer"]
    assert trainer.global_step == 8
    logged = {name: value.item() for name, value in trainer.callback_metrics.items()}
    for name in ("train/entropy", "train/clip/low", "train/clip/high", "train/clip/total", "train/entropy_clip/frac"):
        assert math.isfinite(logged[name]), name
    # The three ClipRatio outputs come from one compute group: low and high are disjoint.
    assert logged["train/clip/total"] == pytest.approx(logged["train/clip/low"] + logged["train/clip/high"])
    assert 0 < logged["train/entropy"] <= math.log(12)


def test_example_aligns_logits_with_the_next_token_at_its_temperature(example: dict[str, Any]) -> None:
    # Brute force: the log-prob of response token t is read from the model run on the prefix that ends
    # just before it (so the model cannot see the token), at temperature T.
    module = example["MyRLModule"](temperature=0.7)
    gen = torch.Generator().manual_seed(3)
    prompt_len, response_len = 3, 5
    sequences = torch.randint(0, 12, (4, prompt_len + response_len), generator=gen)
    with torch.no_grad():
        stats = module.response_stats(sequences, prompt_len, policy_average=True)
        assert stats.logprobs.shape == (4, response_len)
        for t in range(response_len):
            prefix = sequences[:, : prompt_len + t]
            log_p = torch.log_softmax(module.policy(prefix)[:, -1].double() / 0.7, dim=-1)
            token = sequences[:, prompt_len + t]
            expected = log_p.gather(1, token[:, None])[:, 0]
            entropy = -(log_p.exp() * log_p).sum(-1)
            torch.testing.assert_close(stats.logprobs[:, t].double(), expected, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(stats.entropy[:, t].double(), entropy, rtol=1e-5, atol=1e-5)


def test_example_prints_only_its_own_output_and_lightnings_device_lines(tmp_path: Path) -> None:
    """Issue 35 §7: no Lightning cloud tip, no pytree deprecation from inside Lightning, in a user's own script."""
    import subprocess
    import sys

    script = tmp_path / "example.py"
    script.write_text(_example_code())
    env = {**os.environ, "PYTHONPATH": str(README.parents[1])}
    result = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = (result.stdout + result.stderr).splitlines()
    expected = ("GPU available", "TPU available", "`Trainer.fit` stopped: `max_steps=8` reached.", "{'train/clip/high'")
    assert [line for line in lines if not line.startswith(expected)] == []

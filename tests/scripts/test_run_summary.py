"""scripts/docs/run_summary.py reads the values a run logged, at the steps asked for, from its event files."""

from __future__ import annotations

import pytest
from _scripts import load_script


def test_table_from_event_files(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter

    summary = load_script("scripts.docs.run_summary")
    writer = SummaryWriter(str(tmp_path))
    for step, value in [(0, 0.25), (2, 0.5), (4, 0.375)]:  # validations
        writer.add_scalar("val/avg@8", value, step)
    for step in range(4):  # training batches 0..3
        writer.add_scalar("train/entropy/mean", 1.0 - step / 8, step)
    writer.close()

    scalars = summary.read_scalars(tmp_path)
    assert scalars["val/avg@8"] == [(0, 0.25), (2, 0.5), (4, 0.375)]
    table = summary.summary_table(scalars, [0, 3, 4]).splitlines()
    assert table[0] == "| | step 0 | step 3 | step 4 |"
    # step 3 has no validation: the last one before it (step 2); best over the run is 0.5
    assert "| `val/avg@8` | 0.250 | 0.500 | 0.375 (best 0.500) |" in table
    # training scalars stop at batch 3: step 4 shows batch 3's value (1 - 3/8)
    assert "| `train/entropy/mean` | 1.000 | 0.625 | 0.625 |" in table
    assert not any("pass@8" in line for line in table)  # a tag the run did not log has no row


def test_value_before_the_first_point_is_empty():
    summary = load_script("scripts.docs.run_summary")
    assert summary.value_at([(5, 1.0)], 4) is None and summary.value_at([(5, 1.0)], 5) == 1.0

"""Pins lit_entropy.internals.tensorboard: raw summaries written through the writer land in the run's event file."""

from __future__ import annotations

import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams

from lit_entropy.internals.tensorboard import event_file_writer

UPGRADE = f"(torch {torch.__version__}): update lit_entropy/internals/tensorboard.py"


def _events(directory) -> bytes:
    return b"".join(p.read_bytes() for p in directory.iterdir() if p.name.startswith("events.out.tfevents"))


def test_event_file_writer_writes_into_the_runs_own_file(tmp_path) -> None:
    writer = SummaryWriter(tmp_path)
    file_writer = event_file_writer(writer)
    assert file_writer.get_logdir() == str(tmp_path), f"the event writer's directory {UPGRADE}"
    for summary in hparams({"lr": 0.1}, {"val/avg@8": 0.0}):
        file_writer.add_summary(summary)
    writer.close()
    assert [p.is_file() for p in tmp_path.iterdir()] == [True], "no sub-run directory may be created"
    assert b"hparams" in _events(tmp_path) and b"val/avg@8" in _events(tmp_path), f"summary not written {UPGRADE}"
    assert event_file_writer(writer).get_logdir() == str(tmp_path), f"a closed writer must reopen {UPGRADE}"
    writer.close()

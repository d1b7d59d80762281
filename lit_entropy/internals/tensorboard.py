"""TensorBoard's ``SummaryWriter`` private accessor of its event-file writer. Pinned by
``tests/internals/test_tensorboard.py``."""

from __future__ import annotations

from typing import Any

__all__ = ["event_file_writer"]


def event_file_writer(writer: Any) -> Any:
    """The ``FileWriter`` of a ``torch.utils.tensorboard.SummaryWriter`` (reopened if the writer was closed).

    ``add_summary`` on it writes a raw summary (the HPARAMS plugin's) into the run's own event file;
    ``SummaryWriter.add_hparams`` would write into a new sub-run directory instead.
    """
    return writer._get_file_writer()

"""Helpers for tests that spawn gloo process groups on this machine."""

from __future__ import annotations

import socket
from datetime import timedelta

import torch.distributed as dist


def free_port() -> int:
    """A free TCP port on the loopback interface."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def init_gloo(rank: int, world_size: int, port: int) -> None:
    """Join a gloo process group over loopback (call in each spawned worker)."""
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size, timeout=timedelta(seconds=60)
    )

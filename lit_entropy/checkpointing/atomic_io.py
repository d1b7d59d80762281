"""Atomic, durable file and directory writes for checkpoints and exports.

A crash or ``kill -9`` mid-write leaves the previous file intact plus, at worst, a hidden temporary that
the next write into the directory removes. A full disk raises a :class:`DiskFullError` that says so.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO

__all__ = [
    "AtomicCheckpointIO",
    "DiskFullError",
    "atomic_directory_replace",
    "disk_full_message",
    "normalise_permissions",
    "remove_stale_temporaries",
    "swap_directory_in",
    "temporary_name",
]


class AtomicCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic and durable.

    The checkpoint goes to a temporary file in the target directory, is flushed and fsync'ed, then
    ``os.replace``'d over the target (atomic on POSIX within one file system), and the directory entry is
    fsync'ed. A crash mid-write leaves the previous checkpoint intact; a ``kill -9`` mid-write leaves a
    hidden ``.lit_entropy_tmp.*`` file whose name matches no checkpoint pattern (Lightning's ``last`` and
    ``hpc_ckpt_N`` lookups do not see it) and which the next write into that directory removes. Files get
    the usual permissions (``0o666`` minus the umask), not ``mkstemp``'s 0600. A full disk raises an
    ``OSError`` saying "no space left on device" with the path. Remote paths (fsspec URLs) use Lightning's
    transactional write.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        if storage_options is not None:
            raise ValueError(f"storage_options is not supported by AtomicCheckpointIO, got {storage_options!r}")
        if "://" in str(path) and not str(path).startswith("file://"):
            super().save_checkpoint(checkpoint, str(path))
            return
        target = Path(str(path).removeprefix("file://"))
        with disk_full_message(target):
            target.parent.mkdir(parents=True, exist_ok=True)
            remove_stale_temporaries(target.parent)
            tmp = target.parent / temporary_name()
            try:
                fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies
                with os.fdopen(fd, "wb") as handle:
                    writer = _RecordingWriter(handle)
                    try:
                        # a file-like object is all torch.save needs; its annotation asks for an IO[bytes]
                        torch.save(checkpoint, writer)  # type: ignore[arg-type]
                    except RuntimeError as err:
                        # torch's zip writer turns the file's OSError into "[enforce fail at
                        # inline_container.cc] unexpected pos": raise the OSError it hid.
                        if writer.error is not None:
                            raise writer.error from err
                        raise
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp, target)
            except BaseException:
                tmp.unlink(missing_ok=True)
                raise
            _fsync_directory(target.parent)


class _RecordingWriter:
    """A binary file as ``torch.save`` writes it, remembering the ``OSError`` a write raised (ENOSPC, EFBIG)."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.handle.write(data)
        except OSError as err:
            self.error = err
            raise

    def flush(self) -> None:
        try:
            self.handle.flush()
        except OSError as err:
            self.error = err
            raise


class DiskFullError(OSError):
    """A write ran out of space (ENOSPC, a quota, ``ulimit -f``); the target's previous file is intact.

    The command line prints it as one line (``lit-entropy: error: no space left on device while writing ...``).
    """


#: errno values of a write that ran out of room: the device, the user's quota, the process's file size limit.
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


# Temporary files and directories: hidden, and named so that no checkpoint lookup matches them (Lightning
# finds "last" checkpoints by substring and HPC checkpoints by "hpc_ckpt_" plus every digit of the name).
_TMP_PREFIX = ".lit_entropy_tmp."


def temporary_name() -> str:
    """A unique hidden name for a temporary file or directory: ``.lit_entropy_tmp.<host>.<pid>.<random>``.

    Host (hashed to hex) and pid let :func:`remove_stale_temporaries` tell an abandoned temporary (its
    process is gone) from one being written right now.
    """
    return f"{_TMP_PREFIX}{_host_tag()}.{os.getpid()}.{secrets.token_hex(4)}"


def _host_tag() -> str:
    return hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]


def remove_stale_temporaries(directory: str | os.PathLike) -> list[Path]:
    """Delete temporaries in ``directory`` left by a killed writer of this host (its pid no longer runs).

    Returns the removed paths. Temporaries of other hosts (shared file systems) or live processes are kept.
    """
    removed: list[Path] = []
    host = _host_tag()
    try:
        entries = list(Path(directory).iterdir())
    except OSError:
        return removed
    for entry in entries:
        parts = entry.name[len(_TMP_PREFIX) :].split(".") if entry.name.startswith(_TMP_PREFIX) else []
        if len(parts) != 3 or parts[0] != host or not parts[1].isdigit() or _pid_alive(int(parts[1])):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        removed.append(entry)
    return removed


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # it exists, owned by someone else
        return True
    return True


@contextlib.contextmanager
def disk_full_message(path: str | os.PathLike) -> Iterator[None]:
    """Re-raise ``ENOSPC`` / ``EDQUOT`` / ``EFBIG`` as a :class:`DiskFullError` that says so and names ``path``."""
    try:
        yield
    except DiskFullError:
        raise
    except OSError as err:
        if err.errno not in _NO_SPACE:
            raise
        raise DiskFullError(
            err.errno,
            f"no space left on device while writing {path} ({os.strerror(err.errno)}); the previous file, if "
            "any, is intact. Free space on that file system or point the output elsewhere",
        ) from err


def _umask() -> int:
    """The process umask, read without changing it where /proc allows (``os.umask`` must set to read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def normalise_permissions(directory: Path) -> None:
    """Give every file under ``directory`` ``0o666`` minus the umask and every directory ``0o777`` minus it.

    Some writers (``safetensors`` via ``mkstemp``) create 0600 files; an export is meant to be shared.
    """
    mask = _umask()
    for path in [directory, *directory.rglob("*")]:
        if path.is_symlink():
            continue
        os.chmod(path, (0o777 if path.is_dir() else 0o666) & ~mask)


def _fsync_directory(path: Path) -> None:
    """Persist a rename (not possible on every platform; then the rename is still atomic)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_directory_replace(build: Any, target: str | os.PathLike) -> Path:
    """Write a directory atomically: ``build(tmp_dir)`` fills a sibling temp dir that then replaces ``target``.

    Readers see either the old directory or the complete new one (the old one is moved aside, the new one
    renamed in, the old one deleted). Its files and directories get the usual permissions (``0o666`` /
    ``0o777`` minus the umask), whatever the writer used.
    Callers decide whether ``target`` may be replaced (see :func:`lit_entropy.models.export.export_hf_model`).
    """
    target = Path(target)
    with disk_full_message(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(target.parent)
        tmp = target.parent / temporary_name()
        tmp.mkdir()
        try:
            build(tmp)
            normalise_permissions(tmp)
            swap_directory_in(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


def swap_directory_in(tmp: Path, target: Path) -> None:
    """Replace ``target`` by the complete directory ``tmp`` (same file system): readers see the old or the new one.

    The old directory is moved aside, the new one renamed in, the old one deleted.
    """
    old = None
    if target.exists():
        # Not a temporary: were the process killed between the two renames, this is the only copy.
        old = target.parent / f".lit_entropy_old.{target.name}.{os.getpid()}.{secrets.token_hex(4)}"
        os.replace(target, old)
    os.replace(tmp, target)
    _fsync_directory(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)

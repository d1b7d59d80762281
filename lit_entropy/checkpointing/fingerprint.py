"""A fingerprint of a local data file, stored in checkpoints: a resume refuses training data that changed.

Lightning resumes the data position by batch count; on a file that gained or lost rows since the checkpoint,
the resumed run would skip the first batches of a different order without a word.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

__all__ = ["CHECKPOINT_KEY", "data_fingerprint", "fingerprint_change"]

#: Checkpoint key of the training data's fingerprint (absent for built-in, Hub or function datasets).
CHECKPOINT_KEY = "lit_entropy_train_data_fingerprint"

# (path, size, mtime) -> sha256: a run checkpoints many times, the file is read once.
_CACHE: dict[tuple[str, int, int], str] = {}


def data_fingerprint(spec: Any) -> dict[str, str] | None:
    """``{"path": ..., "sha256": ...}`` of a local data file or directory (its files in name order), else None."""
    if not isinstance(spec, str) or (":" in spec and not os.path.exists(spec)):
        return None  # a built-in task, a package.module:function, a Hub dataset
    path = Path(spec)
    if not path.exists():
        return None
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    digest = hashlib.sha256()
    for file in files:
        digest.update(str(file.relative_to(path) if path.is_dir() else file.name).encode())
        digest.update(_file_sha256(file).encode())
    return {"path": str(path), "sha256": digest.hexdigest()}


def _file_sha256(file: Path) -> str:
    stat = file.stat()
    key = (str(file.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _CACHE:
        digest = hashlib.sha256()
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        _CACHE[key] = digest.hexdigest()
    return _CACHE[key]


def fingerprint_change(saved: dict[str, str] | None, spec: Any) -> str | None:
    """Why the training data ``spec`` differs from the checkpoint's ``saved`` fingerprint, or None (same, or
    nothing to compare)."""
    if not saved:
        return None
    now = data_fingerprint(spec)
    if now is None or now["sha256"] == saved.get("sha256"):
        return None
    hashes = f"sha256 {saved['sha256'][:12]} -> {now['sha256'][:12]}"
    return f"{now['path']} changed since the checkpoint was written ({hashes})"

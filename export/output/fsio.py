"""Crash-safe file writes: a file appears under its final name only when complete and on disk."""

from __future__ import annotations

import os
from pathlib import Path


def fsync_write(path: Path, data: bytes) -> None:
    """Write `data` to `path` atomically: temp file, fsync, rename."""
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (renames, new files) to disk, so they survive a power loss too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

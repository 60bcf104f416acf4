"""Durable file writes: the one atomic_write (temporary name, fsync, rename, fsync of the
directory) and fsync_dir. A failed fsync is an error: a write reported done must survive a
crash (docs/architecture.md, "Persistence")."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def fsync_dir(path: str | os.PathLike) -> None:
    """Make the directory's entries (a rename, a new or removed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], None]) -> None:
    """Write a file through ``write(fileobj)`` under a temporary name, fsync, rename, fsync the
    directory: readers see the old file or the whole new one, never a part."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """``atomic_write`` of ``data``."""
    atomic_write(path, lambda f: f.write(data))


def write_json(path: str | os.PathLike, value: object) -> None:
    """``atomic_write`` of ``value`` as JSON."""
    write_bytes(path, json.dumps(value).encode())

"""One owner per data directory (docs/service.md, "Durability"): a node or an embedded client
holds an exclusive ``flock`` on ``<data-dir>/LOCK`` for as long as its store is open.

Two owners would each keep their own idea of where a collection's log ends, and the next append
of one would cut the other's acknowledged records. The kernel drops the lock when the holder's
process ends however it ends (SIGKILL included), so a crash never leaves a stale lock behind.
``flock`` conflicts between two opens in one process too, so a second ``connect(path=...)`` to
the same directory is refused like a second process.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
from pathlib import Path

from .errors import DataDirLockedError

LOCK_NAME = "LOCK"


class DirectoryLock:
    """Held from construction to ``release()`` (or the process's end)."""

    def __init__(self, data_dir: str | os.PathLike):
        self.path = Path(data_dir) / LOCK_NAME
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # a file object, so that an owner dropped without close() releases the lock when
        # collected; O_CLOEXEC (Python's default) keeps it out of child processes
        self._file = open(self.path, "a+b")  # noqa: SIM115 - held for the store's lifetime
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = self._holder()
            self._file.close()
            raise DataDirLockedError(
                f"data directory {str(self.path.parent)!r} is in use by {holder}; a data "
                "directory has one owner at a time: stop that process, or connect to the node "
                "that serves it") from None
        self._file.truncate(0)
        self._file.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname()}).encode())
        self._file.flush()

    def _holder(self) -> str:
        try:
            with open(self.path, "rb") as f:
                who = json.loads(f.read(4096) or b"{}")
            return f"process {int(who['pid'])} on {str(who['host'])[:64]}"
        except (OSError, ValueError, KeyError, TypeError):
            return "another process"

    def release(self) -> None:
        """Give the directory up (idempotent)."""
        if not self._file.closed:
            self._file.close()  # closing the last descriptor drops the flock

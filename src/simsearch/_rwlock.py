"""The reader-writer lock behind the concurrency rule (docs/architecture.md, "Concurrency").

Many readers or one writer. A waiting writer keeps new readers out, so a stream of searches cannot
starve a write. Both sides are re-entrant for the thread that holds them, and the writer may read
(an index whose write path searches itself must not deadlock); a reader may not upgrade to writer.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager


class RWLock:
    """Many readers or one writer, writer-preferring; see the module docstring."""

    __slots__ = ("_mutex", "_cond", "_readers", "_writer", "_depth", "_waiting_writers",
                 "_local", "_timeout")

    def __init__(self, timeout_error: type[Exception] = TimeoutError) -> None:
        self._timeout = timeout_error  # raised when a read's deadline passes while it waits
        # the read path takes the mutex itself: a Condition's `with` is Python code, the lock's
        # is not, and every search passes here
        self._mutex = threading.Lock()
        self._cond = threading.Condition(self._mutex)
        self._readers = 0
        self._writer: int | None = None  # thread ident of the writer
        self._depth = 0  # the writer's re-entry depth
        self._waiting_writers = 0
        self._local = threading.local()  # this thread's read depth

    def acquire_read(self, deadline: float | None = None) -> None:
        """Take the read side (pair with release_read). ``deadline`` (time.monotonic()) bounds
        the wait; past it, the constructor's ``timeout_error``."""
        local = self._local
        held = getattr(local, "depth", 0)
        if held or self._writer == threading.get_ident():
            # nested read (or the writer reading): waiting here for a queued writer would deadlock
            local.depth = held + 1
            return
        with self._mutex:
            if self._writer is not None or self._waiting_writers:
                ok = self._cond.wait_for(
                    lambda: self._writer is None and not self._waiting_writers,
                    None if deadline is None else
                    min(max(0.0, deadline - time.monotonic()), threading.TIMEOUT_MAX),
                )
                if not ok:
                    raise self._timeout("the call's deadline passed while a write held the index")
            self._readers += 1
        local.depth = 1

    def release_read(self) -> None:
        local = self._local
        depth = getattr(local, "depth", 0)
        if depth > 1 or (depth == 1 and self._writer == threading.get_ident()):
            local.depth = depth - 1
            return
        local.depth = 0
        with self._mutex:
            self._readers -= 1
            if not self._readers and self._waiting_writers:
                self._cond.notify_all()

    @contextmanager
    def read(self, deadline: float | None = None):
        """Hold the read side (see acquire_read)."""
        self.acquire_read(deadline)
        try:
            yield
        finally:
            self.release_read()

    @contextmanager
    def write(self):
        """Hold the write side: no reader and no other writer meanwhile."""
        me = threading.get_ident()
        with self._cond:
            if self._writer == me:
                self._depth += 1
            else:
                if getattr(self._local, "depth", 0):
                    raise RuntimeError("a thread holding the read lock cannot take the write lock")
                self._waiting_writers += 1
                try:
                    self._cond.wait_for(lambda: self._writer is None and not self._readers)
                finally:
                    self._waiting_writers -= 1
                self._writer, self._depth = me, 1
        try:
            yield
        finally:
            with self._cond:
                self._depth -= 1
                if not self._depth:
                    self._writer = None
                    self._cond.notify_all()

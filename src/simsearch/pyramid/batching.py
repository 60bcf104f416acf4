"""Concurrent searches merged into one routed batch (docs/cluster.md, "Failures and
stragglers": search batching).

A coordinator's search pays a fixed cost per part call (an RPC on each side, ~1 ms of CPU on a
loaded box) whatever the number of queries in it. So searches that arrive while others are in
flight wait for one of them to finish and then go out together, as one batch: one route, one
call per asked part, one merge. Nothing waits on a timer: a search that finds fewer than
``max_in_flight`` batches running starts at once (a lone client sees no added latency), and
under load the queue that builds up is the batch (group commit, as a database log batches
concurrent commits; Milvus merges concurrent search tasks in its query nodes alike).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable

import numpy as np

from ..errors import DeadlineExceededError
from ..index import SearchResult

#: batches of one collection and search settings running at once; more searches queue. One:
#: with two, batches were smaller and q/s 7-15% lower (400k glove-50, 10 shard processes, 8
#: clients, 1 to 200 queries a call; docs/bench/pyramid.md)
MAX_IN_FLIGHT = 1
#: queries in one merged batch at most (a search larger than this runs alone) ...
MAX_ROWS = 1024
#: ... and at most this many bytes of queries and answers (float32 rows, an id and a score per
#: answer): searches that pass the message limits one by one must pass them merged too
MAX_BYTES = 1 << 20


def rows_for(dim: int, k: int) -> int:
    """Queries of ``dim`` floats with ``k`` answers each that one merged batch may hold."""
    return max(1, min(MAX_ROWS, MAX_BYTES // (4 * dim + 12 * max(1, k))))


class _Waiter:
    __slots__ = ("q", "deadline", "max_rows", "event", "lead", "out")

    def __init__(self, q: np.ndarray, deadline: float | None, max_rows: int):
        self.q, self.deadline, self.max_rows = q, deadline, max_rows
        self.event = threading.Event()
        self.lead = False
        self.out: SearchResult | BaseException | None = None

    def result(self) -> SearchResult:
        if isinstance(self.out, BaseException):
            raise self.out
        return self.out


class SearchBatcher:
    """Group commit for searches: ``search(key, q, deadline, run)`` answers ``q`` by
    ``run(queries, deadline)`` on a batch of the searches of the same ``key`` (the same k and
    search parameters) queued while others ran. ``q`` must already be valid (its checks are
    the caller's, so one bad request cannot fail the batch it would join); a batch runs with
    the latest of its searches' deadlines, and a search whose own deadline passes while it is
    still queued leaves the queue with DeadlineExceededError."""

    def __init__(self, max_in_flight: int = MAX_IN_FLIGHT, max_rows: int = MAX_ROWS):
        if max_in_flight < 1 or max_rows < 1:
            raise ValueError("max_in_flight and max_rows must be at least 1")
        self.max_in_flight, self.max_rows = max_in_flight, max_rows
        self._lock = threading.Lock()
        self._queues: dict[Hashable, list[_Waiter]] = {}
        self._running: dict[Hashable, int] = {}
        self.batches = 0  # batches run, and the searches in them (metrics; batched/batches is
        self.batched = 0  # the mean number of searches a batch merged)

    def queued(self) -> int:
        """Searches waiting for a batch now."""
        with self._lock:
            return sum(len(q) for q in self._queues.values())

    def search(self, key: Hashable, q: np.ndarray, deadline: float | None,
               run: Callable[[np.ndarray, float | None], SearchResult],
               max_rows: int | None = None) -> SearchResult:
        """``max_rows``: this key's batch size limit (at most the batcher's)."""
        w = _Waiter(q, deadline, self.max_rows if max_rows is None else min(max_rows,
                                                                            self.max_rows))
        with self._lock:
            n = self._running.get(key, 0)
            if n < self.max_in_flight:
                self._running[key] = n + 1
                w.lead = True
            else:
                self._queues.setdefault(key, []).append(w)
        if not w.lead:
            self._wait(key, w)
            if not w.lead:
                return w.result()
        self._run_batch(key, w, run)
        return w.result()

    def _wait(self, key: Hashable, w: _Waiter) -> None:
        """Until ``w`` is answered or made the next batch's leader; DeadlineExceededError if
        its deadline passes while it is still queued."""
        timeout = None if w.deadline is None else max(0.0, w.deadline - time.monotonic())
        if w.event.wait(timeout):
            return
        with self._lock:
            queue = self._queues.get(key, [])
            if any(x is w for x in queue):
                queue[:] = [x for x in queue if x is not w]
                raise DeadlineExceededError(
                    "the call's deadline passed while it waited to join a search batch")
        w.event.wait()  # taken into a batch already: its answer is on the way

    def _run_batch(self, key: Hashable, w: _Waiter, run) -> None:
        """Run ``w`` with the searches queued behind it (up to max_rows), answer them all, and
        hand the lead to the next queued search, if any."""
        with self._lock:
            queue = self._queues.get(key, [])
            batch, rows = [w], len(w.q)
            while queue and rows + len(queue[0].q) <= w.max_rows:
                rows += len(queue[0].q)
                batch.append(queue.pop(0))
            self.batches += 1
            self.batched += len(batch)
        try:
            q = batch[0].q if len(batch) == 1 else np.concatenate([x.q for x in batch])
            deadline = None if any(x.deadline is None for x in batch) else max(
                x.deadline for x in batch)
            res = run(q, deadline)
            at = 0
            for x in batch:
                n = len(x.q)
                x.out = res if len(batch) == 1 else SearchResult(
                    res.ids[at : at + n], res.scores[at : at + n], coverage=res.coverage)
                at += n
        except BaseException as exc:  # every search of the batch had the same parameters
            for x in batch:
                x.out = exc
        finally:
            with self._lock:
                queue = self._queues.get(key)
                if queue:
                    nxt = queue.pop(0)
                    nxt.lead = True
                    nxt.event.set()
                else:
                    self._queues.pop(key, None)
                    self._running[key] -= 1
                    if not self._running[key]:
                        del self._running[key]
            for x in batch[1:]:
                x.event.set()

"""A coordinator's search batching (pyramid/batching.py): searches queued while others run go
out as one batch, each answered with its own rows; deadlines, errors and the batch size."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from simsearch.errors import DeadlineExceededError
from simsearch.index import SearchResult
from simsearch.pyramid.batching import SearchBatcher


class Parts:
    """A stand-in for the routed search: records each batch; the first waits for ``gate``."""

    def __init__(self, fail_on: int | None = None):
        self.gate = threading.Event()
        self.running = threading.Event()
        self.calls: list[np.ndarray] = []
        self.deadlines: list = []
        self.fail_on = fail_on

    def __call__(self, q, deadline):
        self.calls.append(q.copy())
        self.deadlines.append(deadline)
        if len(self.calls) == 1:
            self.running.set()
            assert self.gate.wait(10)
        if len(self.calls) == self.fail_on:
            raise ValueError("boom")
        return SearchResult(q[:, :2].astype(np.int64), q[:, :2].copy())


def rows(first: int, n: int) -> np.ndarray:
    return np.arange(first, first + 2 * n, dtype=np.float32).reshape(n, 2)


def start(batcher, parts, q, out, key="k", deadline=None):
    def go():
        try:
            out.append((q, batcher.search(key, q, deadline, parts)))
        except Exception as exc:  # noqa: BLE001 - the test looks at it
            out.append((q, exc))

    t = threading.Thread(target=go, daemon=True)
    t.start()
    return t


def wait_for(cond, timeout=10.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.005)


def test_queued_searches_go_out_as_one_batch_each_answered_with_its_own_rows():
    """Seen failing with the batch's rows handed out without advancing the offset (every
    search got the first one's answers)."""
    b, parts, out = SearchBatcher(max_in_flight=1), Parts(), []
    first = start(b, parts, rows(0, 1), out)
    assert parts.running.wait(10)
    ts = [start(b, parts, rows(100 * i, i), out, deadline=time.monotonic() + 30)
          for i in (1, 2, 3)]
    wait_for(lambda: b.queued() == 3)
    parts.gate.set()
    for t in [first, *ts]:
        t.join(10)
    assert [len(c) for c in parts.calls] == [1, 6]  # the three queued ones: one batch
    assert parts.deadlines[1] is not None  # the latest of theirs
    assert len(out) == 4
    for q, res in out:
        assert isinstance(res, SearchResult)
        np.testing.assert_array_equal(res.ids, q[:, :2].astype(np.int64))
    assert (b.batches, b.batched) == (2, 4)


def test_other_keys_do_not_join_and_max_rows_splits_batches():
    b, parts, out = SearchBatcher(max_in_flight=1, max_rows=4), Parts(), []
    first = start(b, parts, rows(0, 1), out)
    assert parts.running.wait(10)
    ts = [start(b, parts, rows(100 * i, 3), out) for i in (1, 2)]
    wait_for(lambda: b.queued() == 2)
    other = start(b, parts, rows(900, 1), out, key="other")  # its own key: runs at once
    other.join(10)
    assert not other.is_alive()
    parts.gate.set()
    for t in [first, *ts]:
        t.join(10)
    assert sorted(len(c) for c in parts.calls) == [1, 1, 3, 3]  # 3 + 3 > max_rows
    for q, res in out:
        np.testing.assert_array_equal(res.ids, q[:, :2].astype(np.int64))


def test_a_queued_search_past_its_deadline_leaves_the_queue():
    """Seen failing with the waiter's timeout removed: it waited for the batch ahead of it."""
    b, parts, out = SearchBatcher(max_in_flight=1), Parts(), []
    first = start(b, parts, rows(0, 1), out)
    assert parts.running.wait(10)
    late = start(b, parts, rows(100, 1), out, deadline=time.monotonic() + 0.2)
    late.join(10)
    assert not late.is_alive() and isinstance(out[-1][1], DeadlineExceededError)
    assert b.queued() == 0
    parts.gate.set()
    first.join(10)
    assert len(parts.calls) == 1  # the late search was never sent


def test_an_error_reaches_every_search_of_its_batch_and_the_next_batch_runs():
    """Seen failing (a hang) with the lead not handed on when the batch raised."""
    b, parts, out = SearchBatcher(max_in_flight=1), Parts(fail_on=2), []
    first = start(b, parts, rows(0, 1), out)
    assert parts.running.wait(10)
    ts = [start(b, parts, rows(100 * i, 1), out) for i in (1, 2)]
    wait_for(lambda: b.queued() == 2)
    parts.gate.set()
    for t in [first, *ts]:
        t.join(10)
    errors = [r for _, r in out if isinstance(r, Exception)]
    assert len(errors) == 2 and all(isinstance(e, ValueError) for e in errors)
    after = []
    t = start(b, parts, rows(500, 2), after)  # nothing left holding the lead
    t.join(10)
    assert not t.is_alive(), "the lead was never handed on"
    np.testing.assert_array_equal(after[0][1].ids, rows(500, 2).astype(np.int64))


def test_many_threads_each_get_their_own_answers():
    b = SearchBatcher(max_in_flight=2)
    calls = []

    def run(q, deadline):
        calls.append(len(q))
        time.sleep(0.001)
        return SearchResult(q[:, :2].astype(np.int64), q[:, :2].copy())

    bad = []

    def client(t):
        for i in range(50):
            q = rows(10_000 * t + 10 * i, 1 + (i % 3))
            got = b.search("k", q, None, run)
            if not np.array_equal(got.ids, q[:, :2].astype(np.int64)):
                bad.append((t, i))

    ts = [threading.Thread(target=client, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert not bad
    assert b.batched == 400 and b.batches == len(calls) < 400  # some were merged
    assert b.queued() == 0


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        SearchBatcher(max_in_flight=0)


def test_a_batch_stays_within_the_message_budget():
    """Wide queries with many answers merge fewer at a time: searches that fit the message
    limits alone must fit them merged (seen failing with the limit ignored: one batch of 8)."""
    from simsearch.pyramid.batching import MAX_BYTES, rows_for

    assert rows_for(50, 10) == 1024
    wide = rows_for(4096, 1000)
    assert wide * (4 * 4096 + 12 * 1000) <= MAX_BYTES and wide >= 1
    b, parts, out = SearchBatcher(max_in_flight=1), Parts(), []
    first = start(b, parts, rows(0, 1), out)
    assert parts.running.wait(10)

    def go(i):
        out.append((None, b.search("k", rows(100 * i, 1), None, parts, max_rows=3)))

    ts = [threading.Thread(target=go, args=(i,), daemon=True) for i in range(1, 9)]
    for t in ts:
        t.start()
    wait_for(lambda: b.queued() == 8)
    parts.gate.set()
    for t in [first, *ts]:
        t.join(10)
    assert max(len(c) for c in parts.calls[1:]) <= 3 and sum(map(len, parts.calls)) == 9

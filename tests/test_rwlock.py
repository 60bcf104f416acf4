"""The reader-writer lock behind the concurrency rule, and the result-size limit of search."""

import threading
import time

import numpy as np
import pytest

import simsearch._validate as validate_mod
from simsearch._rwlock import RWLock
from simsearch.errors import InvalidParameterError
from simsearch.flat import FlatIndex


def test_readers_share_and_writer_excludes():
    lock = RWLock()
    inside = []
    barrier = threading.Barrier(3)

    def reader():
        with lock.read():
            inside.append(1)
            barrier.wait(timeout=5)  # all three readers inside at once, or this times out

    ts = [threading.Thread(target=reader) for _ in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(5)
    assert len(inside) == 3

    events = []
    with lock.write():
        t = threading.Thread(target=lambda: (lock.read().__enter__(), events.append("read")))
        t.start()
        t.join(0.2)
        assert events == []  # the reader waits for the writer
    t.join(5)
    assert events == ["read"]


def _late_read(lock: RWLock):
    """Try a read with a 50 ms deadline from another thread; what it raised (or None)."""
    out = []

    def reader():
        try:
            with lock.read(deadline=time.monotonic() + 0.05):
                out.append(None)
        except Exception as exc:
            out.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    t.join(5)
    return out[0]


def test_waiting_writer_keeps_new_readers_out():
    lock = RWLock()
    order = []
    first = lock.read()
    first.__enter__()
    w = threading.Thread(target=lambda: lock.write().__enter__() or order.append("write"))
    w.start()
    while not lock._waiting_writers:  # the writer is queued behind the first reader
        time.sleep(0.001)
    assert isinstance(_late_read(lock), TimeoutError)  # another thread: the holder may nest
    first.__exit__(None, None, None)
    w.join(5)
    assert order == ["write"]


def test_reentrant_for_the_holder():
    lock = RWLock()
    with lock.write():
        with lock.write():
            with lock.read():
                pass
    with lock.read():
        with lock.read():
            pass
        with pytest.raises(RuntimeError, match="cannot take the write lock"):
            with lock.write():
                pass
    with lock.write():  # everything was released
        pass


def test_deadline_error_type_is_configurable():
    class Late(Exception):
        pass

    lock = RWLock(Late)
    with lock.write():
        assert isinstance(_late_read(lock), Late)


def test_k_beyond_n_pads_and_huge_results_are_refused(monkeypatch):
    rng = np.random.default_rng(0)
    idx = FlatIndex(8, "ip")
    idx.add(rng.standard_normal((100, 8)).astype(np.float32))
    r = idx.search(rng.standard_normal((3, 8)).astype(np.float32), 150)
    assert r.ids.shape == (3, 150)
    assert (r.ids[:, :100] >= 0).all() and (r.ids[:, 100:] == -1).all()
    assert np.isneginf(r.scores[:, 100:]).all()
    monkeypatch.setattr(validate_mod, "MAX_RESULT_ENTRIES", 1000)
    with pytest.raises(InvalidParameterError, match="at most 1000 entries"):
        idx.search(np.zeros((11, 8), np.float32), 100)
    assert idx.search(np.zeros((10, 8), np.float32), 100).ids.shape == (10, 100)

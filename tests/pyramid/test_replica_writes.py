"""RemotePart's write to all replicas: every failed replica is marked out of sync (no processes)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

pytest.importorskip("grpc")

from simsearch.pyramid.datapath import RemotePart  # noqa: E402
from simsearch.service.errors import (  # noqa: E402
    ServiceError,
    ServiceUnavailableError,
)


class FakePool:
    def __init__(self, n_shards: int = 0):
        self.n_shards = n_shards
        self.executor = ThreadPoolExecutor(4)
        self.out_of_sync: set[int] = set()
        self.down: set[int] = set()

    def replicas_of(self, name):
        return list(range(self.n_shards))

    def in_sync(self, name, sid):
        return sid not in self.out_of_sync

    def mark_down(self, sid):
        self.down.add(sid)

    def mark_out_of_sync(self, name, sid):
        self.out_of_sync.add(sid)


def part_with(outcomes):
    """A part on shards 0..n-1 whose write on shard s raises outcomes[s] (None: succeeds)."""
    pool = FakePool(len(outcomes))
    part = RemotePart(pool, "p0", {})
    applied = []

    def col(sid):
        def write():
            if outcomes[sid] is not None:
                raise outcomes[sid]
            applied.append(sid)
        return write

    part._col = col
    return pool, part, applied


def test_every_failed_replica_is_marked_even_after_a_refusal():
    # shard 0 refuses (a request error), shard 1 is unreachable, shard 2 takes the write
    pool, part, applied = part_with([ServiceError("bad", code="INVALID_ARGUMENT"),
                                     ServiceUnavailableError("gone"), None])
    part._write_all(lambda write: write())
    assert applied == [2]
    assert pool.out_of_sync == {0, 1}
    assert pool.down == {1}


def test_a_refusal_by_every_replica_raises_it_and_marks_nothing():
    err = ServiceError("bad ids", code="INVALID_ARGUMENT")
    pool, part, applied = part_with([err, err])
    with pytest.raises(ServiceError, match="bad ids"):
        part._write_all(lambda write: write())
    assert applied == [] and pool.out_of_sync == set() and pool.down == set()


def test_no_replica_reachable_raises_unavailable_and_marks_all():
    pool, part, applied = part_with([ServiceUnavailableError("a"), OSError("b")])
    with pytest.raises(ServiceUnavailableError, match="no in-sync replica"):
        part._write_all(lambda write: write())
    assert pool.out_of_sync == {0, 1} and pool.down == {0, 1}


def test_refusal_with_one_unreachable_raises_the_refusal_and_marks_the_unreachable():
    pool, part, applied = part_with([ServiceUnavailableError("gone"),
                                     ServiceError("bad", code="INVALID_ARGUMENT")])
    with pytest.raises(ServiceError, match="bad"):
        part._write_all(lambda write: write())
    assert pool.out_of_sync == {0}
    np.testing.assert_array_equal(sorted(pool.down), [0])

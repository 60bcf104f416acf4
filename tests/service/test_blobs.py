"""Named blobs on a node (docs/service.md, "Blobs"): chunked round trips, checksums end to end,
atomic replacement, damage detected, restarts survived."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from simsearch.errors import InvalidParameterError, UnsupportedOperationError
from simsearch.service.errors import CollectionNotFoundError, DataLossError
from simsearch.service.shardclient import connect_shard


def test_blob_round_trip_chunked_replaced_damaged_and_restarted(server_factory):
    srv = server_factory("--max-message-bytes", str(64 << 10))  # 64 KiB: many chunks
    c = connect_shard(srv.address, timeout=30)
    data = np.random.default_rng(0).bytes(300_000)
    info = c.put_blob("r.router.1", data)
    assert info == {"name": "r.router.1", "size": len(data),
                    "sha256": hashlib.sha256(data).hexdigest()}
    assert c.get_blob("r.router.1") == data
    c.put_blob("r.router.1", b"newer")  # replaced whole
    assert c.get_blob("r.router.1") == b"newer"
    assert c.list_blobs() == [{"name": "r.router.1", "size": 5,
                               "sha256": hashlib.sha256(b"newer").hexdigest()}]
    assert c.list_collections() == []  # blobs are not collections
    with pytest.raises(InvalidParameterError, match="name"):
        c.put_blob("../escape", b"x")
    with pytest.raises(CollectionNotFoundError):
        c.get_blob("absent")
    c.delete_blob("absent")  # idempotent
    srv.restart()
    c = connect_shard(srv.address, timeout=30)
    assert c.get_blob("r.router.1") == b"newer"
    # damage on disk is found, not served
    path = srv.data_dir / "blobs" / "r.router.1"
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(DataLossError, match="damaged"):
        c.get_blob("r.router.1")
    c.delete_blob("r.router.1")
    assert c.list_blobs() == []


def test_a_put_whose_checksum_does_not_match_stores_nothing(tmp_path):
    from simsearch.service.store import Store

    st = Store(tmp_path)
    st.put_blob("b", b"old", hashlib.sha256(b"old").hexdigest())
    with pytest.raises(InvalidParameterError, match="sha256"):
        st.put_blob("b", b"new", hashlib.sha256(b"other").hexdigest())
    assert st.get_blob("b")[0] == b"old"


def test_a_coordinator_store_has_no_blobs():
    from types import SimpleNamespace

    from simsearch.service.servicer import SimSearchServicer

    with pytest.raises(UnsupportedOperationError, match="no blobs"):  # a store declaring none
        SimSearchServicer(SimpleNamespace(blobs=None), 1 << 20)._blobs()

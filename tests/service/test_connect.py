"""simsearch.connect with several addresses: calls move to a live node when one goes away."""

from __future__ import annotations

import numpy as np
import pytest

import simsearch as ss
from simsearch.errors import InvalidParameterError


def test_failover_between_two_nodes(server_factory):
    a, b = server_factory(), server_factory()
    x = np.random.default_rng(0).standard_normal((50, 8)).astype(np.float32)
    for s in (a, b):  # the same data on both (as replicas would hold it)
        s.client().create_collection("c", 8, "l2", "flat").add(x, np.arange(50))
    with ss.connect([a.address, b.address], timeout=20) as client:
        col = client.collection("c")
        assert (col.search(x[:5], 1).ids[:, 0] == np.arange(5)).all()
        a.kill()  # the node the channel picked first
        assert (col.search(x[5:10], 1).ids[:, 0] == np.arange(5, 10)).all()
        col.add(x[:3] + 1, ids=[100, 101, 102], upsert=True)  # an idempotent write moves too
        assert len(col) == 53
    with ss.connect(f"{b.address},{b.address}") as client:
        assert client.list_collections() == ["c"]


def test_bad_addresses_are_typed():
    with pytest.raises(InvalidParameterError):
        ss.connect(" , ")
    with pytest.raises(InvalidParameterError, match="host:port"):
        ss.connect(["127.0.0.1:1", "nohostport"])

"""The asyncio client (simsearch.aio): the same answers as the sync client on a node and on a
cluster's coordinators, fail-over between addresses, typed errors, concurrent calls."""

from __future__ import annotations

import asyncio
import itertools

import numpy as np
import pytest

pytest.importorskip("grpc")

import simsearch as ss  # noqa: E402
import simsearch.aio  # noqa: E402
from simsearch.service.errors import CollectionNotFoundError  # noqa: E402

DIM, K = 10, 5
_names = itertools.count()


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    from nodeproc import ServerProcess

    out = [ServerProcess(tmp_path_factory.mktemp("aio") / f"n{i}") for i in range(2)]
    yield out
    for s in out:
        s.kill()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(5)
    return (rng.standard_normal((400, DIM)).astype(np.float32),
            rng.standard_normal((8, DIM)).astype(np.float32))


async def exercise(client, name, x, q, kind="hnsw", train=False, **params):
    col = await client.create_collection(name, DIM, "l2", kind, **params)
    if train:
        await col.train(x)
    ids = await col.add(x, attributes={"even": [i % 2 == 0 for i in range(len(x))]})
    await col.add(x[:3] * 2, ids=[5000, 5001, 5002], upsert=True)
    removed = await col.remove([1, 2, 999_999], missing_ok=True)
    searches = await asyncio.gather(*(col.search(q[i : i + 1], K) for i in range(len(q))))
    return (ids, removed, await col.count(), np.vstack([r.ids for r in searches]),
            (await col.search(q, K, where={"even": True})).ids,
            await col.get([5001, 0, 7], vectors=True), (await col.describe())["count"])


def sync_exercise(client, name, x, q, kind="hnsw", train=False, **params):
    col = client.create_collection(name, DIM, "l2", kind, **params)
    if train:
        col.train(x)
    ids = col.add(x, attributes={"even": [i % 2 == 0 for i in range(len(x))]})
    col.add(x[:3] * 2, ids=[5000, 5001, 5002], upsert=True)
    removed = col.remove([1, 2, 999_999], missing_ok=True)
    searches = [col.search(q[i : i + 1], K) for i in range(len(q))]
    return (ids, removed, len(col), np.vstack([r.ids for r in searches]),
            col.search(q, K, where={"even": True}).ids,
            col.get([5001, 0, 7], vectors=True), col.describe()["count"])


def assert_same(a, b):
    np.testing.assert_array_equal(a[0], b[0])
    assert a[1:3] == b[1:3]
    np.testing.assert_array_equal(a[3], b[3])
    np.testing.assert_array_equal(a[4], b[4])
    np.testing.assert_array_equal(a[5]["ids"], b[5]["ids"])
    np.testing.assert_allclose(a[5]["vectors"], b[5]["vectors"])
    assert a[5]["attributes"] == b[5]["attributes"] and a[6] == b[6]


async def test_a_node_answers_the_async_client_as_the_sync_one(nodes, data):
    x, q = data
    async with simsearch.aio.connect(nodes[0].address, timeout=60) as c:
        assert (await c.health()) == "SERVING"
        got = await exercise(c, f"a{next(_names)}", x, q, M=16)
        with pytest.raises(CollectionNotFoundError):
            await c.collection("missing")
        col = await c.create_collection(f"e{next(_names)}", DIM)
        with pytest.raises(ss.errors.DimensionMismatchError):  # checked before sending
            await col.search(np.ones((1, 3)), 1)
        await col.add(np.ones((1, DIM)), ids=[1])
        with pytest.raises(ss.errors.DuplicateIdError):  # found by the server
            await col.add(np.ones((1, DIM)), ids=[1])
    with ss.connect(nodes[0].address, timeout=60) as c:
        want = sync_exercise(c, f"s{next(_names)}", x, q, M=16)
    assert_same(got, want)


async def test_calls_fail_over_to_the_next_address(nodes, data):
    x, q = data
    name = f"f{next(_names)}"
    with ss.connect(nodes[1].address, timeout=60) as c:
        c.create_collection(name, DIM, "l2", "flat").add(x)
    nodes[0].kill()  # the first address is gone for good
    async with simsearch.aio.connect([nodes[0].address, nodes[1].address], timeout=30) as c:
        col = await c.collection(name)
        r = await col.search(q, K)
        await col.add(x[:2], ids=[9000, 9001], upsert=True)  # idempotent: retried
        assert await col.count() == len(x) + 2
    want = ss.FlatIndex(DIM, "l2")
    want.add(x)
    np.testing.assert_array_equal(r.ids, want.search(q, K).ids)


async def test_a_cluster_answers_the_async_client_as_the_sync_one(tmp_path, data):
    from simsearch.pyramid.launcher import LocalCluster

    x, q = data
    params = dict(n_centers=8, n_partitions=2, sub_index="flat", kind="pyramid", train=True)
    with LocalCluster(tmp_path / "cl", 2, 1, "--coordinators", "2") as cl:
        async with simsearch.aio.connect(cl.coordinators, timeout=60) as c:
            got = await exercise(c, f"a{next(_names)}", x, q, **params)
        with ss.connect(cl.coordinators, timeout=60) as c:
            want = sync_exercise(c, f"s{next(_names)}", x, q, **params)
    assert_same(got, want)


def test_a_gather_of_hundreds_of_searches_all_answer(tmp_path):
    """The defect: the documented ``gather`` of 300 searches through the asyncio client had
    133 fail RESOURCE_EXHAUSTED (the node sheds past --max-concurrent-rpcs, and nothing on the
    client bounded or retried). Here the node sheds past 4: every search must still answer,
    through the client's in-flight bound (8, over the node's 4) and its backoff."""
    from nodeproc import ServerProcess

    node = ServerProcess(tmp_path / "d", "--max-concurrent-rpcs", "4", "--workers", "4")
    x = np.random.default_rng(1).standard_normal((2000, DIM)).astype(np.float32)

    async def main():
        async with simsearch.aio.connect(node.address, max_in_flight=8) as client:
            col = await client.create_collection("c", DIM, "l2", "flat")
            await col.add(x)
            found = await asyncio.gather(*(col.search(x[i], k=1) for i in range(300)))
            return [r.ids[0, 0].item() for r in found]

    try:
        assert asyncio.run(main()) == list(range(300))
    finally:
        node.kill()

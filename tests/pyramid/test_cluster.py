"""The cluster over real processes equals the in-process PyramidIndex; failures and recovery."""

from __future__ import annotations

import json
import signal
import time

import numpy as np
import pytest

pytest.importorskip("grpc")

import simsearch as ss  # noqa: E402
from simsearch.datasets import synthetic_longtail  # noqa: E402
from simsearch.eval import thread_limit  # noqa: E402
from simsearch.pyramid import PyramidIndex  # noqa: E402
from simsearch.pyramid.cluster import open_router  # noqa: E402
from simsearch.service.errors import ServiceUnavailableError  # noqa: E402

DIM, K = 16, 10
PARAMS = dict(n_centers=24, n_partitions=3, mips_replicas=30, sub_index="flat")


@pytest.fixture(scope="module")
def data():
    return synthetic_longtail(n=1500, dim=DIM, n_queries=30, n_clusters=20, seed=5)


def local(metric, base):
    with thread_limit(1):  # the coordinator trains single-threaded too
        p = PyramidIndex(DIM, metric, **PARAMS)
        p.train(base)
    p.add(base[:1000])
    p.add(base[1000:])
    p.remove(np.arange(0, 1500, 11))
    return p


def wait_until(cond, timeout=30.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out"
        time.sleep(0.1)


def test_cluster_equals_in_process_and_survives_a_dead_shard(cluster_factory, data):
    base, queries = data
    cl = cluster_factory(3, 2)
    client = ss.connect(cl.coordinator, timeout=60)
    col = client.create_collection("docs", DIM, "ip", "pyramid", **PARAMS)
    col.train(base)
    col.add(base[:1000])
    col.add(base[1000:], ids=np.arange(1000, 1500))
    col.remove(np.arange(0, 1500, 11))
    ref = local("ip", base)
    assert len(col) == len(ref)
    for branching in (2, 24):
        a = col.search(queries, K, branching=branching)
        b = ref.search(queries, K, branching=branching)
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    # the router copied into this process asks the shards directly and answers the same
    router = open_router(cl.dir, cl.coordinator, "docs")
    try:
        np.testing.assert_array_equal(router.search(queries, K, branching=2).ids,
                                      ref.search(queries, K, branching=2).ids)
    finally:
        router.parts[0].pool.close()
    # every part on two different shards
    cmap = json.loads((cl.dir / "cluster.json").read_text())
    assert cmap["replicas"] == 2 and len(cmap["shards"]) == 3
    # a shard dies: no failed query, same answers (routed to the surviving replicas)
    old = cl.pid("shard-0")  # read before the kill: the supervisor may restart it within 1 s
    cl.signal_shard(0, signal.SIGKILL)
    for _ in range(5):
        np.testing.assert_array_equal(col.search(queries, K, branching=24).ids,
                                      ref.search(queries, K, branching=24).ids)
    # writes while it is down reach the other replica; it catches up when restarted
    col.add(base[:3] * 1.01, ids=[5000, 5001, 5002])
    ref.add(base[:3] * 1.01, ids=[5000, 5001, 5002])
    wait_until(lambda: cl.pid("shard-0") != old)  # the supervisor restarts it
    wait_until(lambda: not json.loads((cl.dir / "cluster.json").read_text())["out_of_sync"])
    cl.signal_shard(1, signal.SIGKILL)  # now only the recovered copies can answer for some parts
    for _ in range(3):
        np.testing.assert_array_equal(col.search(queries, K, branching=24).ids,
                                      ref.search(queries, K, branching=24).ids)


def test_partial_results_and_complete_required(cluster_factory, data):
    base, queries = data
    cl = cluster_factory(2, 1, "--no-restart")
    client = ss.connect(cl.coordinator, timeout=60)
    col = client.create_collection("docs", DIM, "l2", "pyramid", **PARAMS)
    col.train(base)
    col.add(base)
    cl.signal_shard(0, signal.SIGKILL)
    time.sleep(1.0)
    r = col.search(queries, K, branching=24, require_complete=False)
    assert 0 < r.coverage < 1 and (r.ids >= 0).any()
    with pytest.raises(ServiceUnavailableError, match="replica"):
        col.search(queries, K, branching=24)


def test_deadline_gives_partial_results_and_status(cluster_factory, data):
    import subprocess
    import sys

    base, queries = data
    cl = cluster_factory(2, 1, "--no-restart")
    col = ss.connect(cl.coordinator, timeout=60).create_collection(
        "docs", DIM, "cosine", "pyramid", **PARAMS)
    col.train(base)
    col.add(base)
    st = subprocess.run([sys.executable, "-m", "simsearch.pyramid.cluster", "status",
                         "--data-dir", str(cl.dir)], capture_output=True, text=True)
    assert st.returncode == 0 and "epoch" in st.stdout and "docs.p0=" in st.stdout
    cl.signal_shard(1, signal.SIGSTOP)  # a straggler that still holds its connections
    try:
        # the coordinator answers within the client's deadline with what the live shard has
        fast = ss.connect(cl.coordinator, timeout=5).collection("docs")
        r = fast.search(queries[:5], K, branching=24, require_complete=False)
        assert r.coverage < 1 and (r.ids >= 0).any()
    finally:
        cl.signal_shard(1, signal.SIGCONT)
    ss.connect(cl.coordinator, timeout=60).drop_collection("docs")
    shard0 = ss.connect(json.loads((cl.dir / "cluster.json").read_text())["shards"][0]["address"])
    assert shard0.list_collections() == []


def test_shard_that_lost_its_directory_is_rebuilt_from_a_replica(cluster_factory, data):
    import shutil

    base, queries = data
    cl = cluster_factory(3, 2, "--restart-delay", "3")
    col = ss.connect(cl.coordinator, timeout=60).create_collection(
        "docs", DIM, "l2", "pyramid", **PARAMS)
    col.train(base)
    col.add(base)
    want = col.search(queries, K, branching=24).ids
    old = cl.pid("shard-0")
    cl.signal_shard(0, signal.SIGKILL)
    shutil.rmtree(cl.dir / "shard-0")  # before the supervisor restarts it (3 s)
    wait_until(lambda: cl.pid("shard-0") != old)
    shard0 = ss.connect(json.loads((cl.dir / "cluster.json").read_text())["shards"][0]["address"])
    wait_until(lambda: sorted(shard0.list_collections()) == ["docs.p0", "docs.p2"])
    wait_until(lambda: len(shard0.collection("docs.p0")) > 0)
    cl.signal_shard(1, signal.SIGKILL)  # part 0 now has only shard 0's rebuilt copy
    for _ in range(3):
        np.testing.assert_array_equal(col.search(queries, K, branching=24).ids, want)


def test_pool_reads_fall_back_to_in_sync_replicas_and_caches_p95(tmp_path):
    """A missed health probe must not fail reads when no replica looks up (a dead one fails
    fast); out-of-sync replicas are never read; the hedge delay is the recent p95."""
    from types import SimpleNamespace

    from simsearch.pyramid.cluster import ShardPool

    shards = [{"id": i, "address": f"127.0.0.1:{1 + i}"} for i in range(3)]  # nothing listens
    (tmp_path / "cluster.json").write_text(json.dumps(
        {"shards": shards, "replicas": 2, "epoch": 0, "out_of_sync": {"c.p0": [1]}}))
    pool = ShardPool(tmp_path, timeout=1.0, health_interval=60)
    try:
        assert not any(pool.up.values())
        assert pool.serving(SimpleNamespace(name="c.p0", shards=[0, 1])) == [0]
        assert pool.serving(SimpleNamespace(name="c.p1", shards=[1, 2])) == [1, 2]
        pool.up[2] = True
        assert pool.serving(SimpleNamespace(name="c.p1", shards=[1, 2])) == [2]
        assert pool.hedge_delay("c.p0") == 0.05  # until enough calls were timed
        for ms in range(1, 97):  # recomputed every 16 calls
            pool.record("c.p0", ms / 1000)
        assert pool.hedge_delay("c.p0") == pytest.approx(np.percentile(np.arange(1, 97), 95)
                                                         / 1000)
    finally:
        pool.close()


def test_follower_coordinator_reads_locally_forwards_writes_and_outlives_the_leader(
        cluster_factory, data):
    from simsearch.service.errors import ServiceUnavailableError

    base, queries = data
    cl = cluster_factory(3, 2, "--coordinators", "2", "--no-restart")
    leader_addr, follower_addr = (c["address"] for c in cl.processes["coordinators"])
    follower = ss.connect(follower_addr, timeout=60)
    col = follower.create_collection("docs", DIM, "ip", "pyramid", **PARAMS)  # forwarded
    col.train(base)
    assert (col.search(queries[:2], K).ids == -1).all()  # empty: the follower's copy is too
    col.add(base[:1000])
    assert (col.search(queries[:2], K).ids >= 0).all()  # an empty copy asks the leader first
    col.add(base[1000:], ids=np.arange(1000, 1500))
    col.remove(np.arange(0, 1500, 11))
    ref = local("ip", base)
    lead = ss.connect(leader_addr, timeout=60).collection("docs")
    assert len(col) == len(lead) == len(ref)
    assert follower.list_collections() == ["docs"]
    for branching in (2, 24):
        want = ref.search(queries, K, branching=branching).ids
        np.testing.assert_array_equal(col.search(queries, K, branching=branching).ids, want)
        np.testing.assert_array_equal(lead.search(queries, K, branching=branching).ids, want)
    # the leader dies: the follower keeps answering from its router copy; writes need the leader
    import os

    os.kill(cl.pid("coord-0"), signal.SIGKILL)
    want = ref.search(queries, K, branching=24).ids
    for _ in range(3):
        np.testing.assert_array_equal(col.search(queries, K, branching=24).ids, want)
    with pytest.raises(ServiceUnavailableError):
        col.add(base[:1], ids=[9000])

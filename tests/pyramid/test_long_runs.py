"""A cluster that lives long (docs/cluster.md, "Long runs"): etcd never fills.

The defect: nothing compacted etcd's history, and a router checkpoint came only every
200 log records whatever their size. An etcd started with a 32 MiB quota answered "database space
exceeded" after 1,313 upserts, and every write and search failed from then on. Run against the
code before these changes (compaction and the byte trigger taken out), this test failed the same
way: its etcd of a 2 MiB quota refused the load's writes once about 2 MiB of log had been
written.
"""

from __future__ import annotations

import time
import urllib.request

import numpy as np
import pytest

import simsearch as ss
from simsearch.service.shardclient import connect_shard

pytest.importorskip("grpc")

from simsearch.pyramid.control.etcd import Etcd  # noqa: E402
from simsearch.pyramid.control.etcd_server import LocalEtcd, embedded_is_safe  # noqa: E402
from simsearch.pyramid.launcher import LocalCluster  # noqa: E402

DIM = 8
QUOTA = 2 << 20
CHECKPOINT_BYTES = 256 << 10
PARAMS = dict(n_centers=16, n_partitions=2, sub_index="flat")


def _metric(port: int, name: str) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in the metrics")


def test_etcd_never_fills_under_a_long_upsert_load(tmp_path):
    etcd = LocalEtcd(str(tmp_path / "etcd"), quota_bytes=QUOTA).start()
    try:
        extra = [] if embedded_is_safe() else ["--allow-unsafe-etcd"]
        with LocalCluster(tmp_path / "cl", 2, 2, "--etcd", etcd.url, "--no-restart",
                          "--metrics", "--checkpoint-log-bytes", str(CHECKPOINT_BYTES),
                          *extra) as cl, \
                Etcd(etcd.url, "probe") as probe, ss.connect(cl.coordinator, timeout=60) as c:
            port = next(i["metrics_port"] for i in cl.up["processes"].values()
                        if i.get("address") == cl.coordinator)
            rng = np.random.default_rng(0)
            pool = rng.choice(10**9, 80_000, replace=False)
            col = c.create_collection("docs", DIM, "l2", "pyramid", **PARAMS)
            col.train(rng.standard_normal((2000, DIM)).astype(np.float32))
            writes, sizes = 0, []
            while _metric(port, "simsearch_pyramid_router_log_bytes_total") < 10 * QUOTA:
                ids = rng.choice(pool, 8000, replace=False)
                col.add(rng.standard_normal((8000, DIM)).astype(np.float32), ids=ids,
                        upsert=True)  # every write must succeed
                writes += 1
                if writes % 5 == 0:
                    sizes.append((_metric(port, "simsearch_pyramid_etcd_compactions_total"),
                                  probe.db_size()))
            written = _metric(port, "simsearch_pyramid_router_log_bytes_total")
            after_first = [s for n, s in sizes if n >= 1]
            assert after_first, sizes
            # flat: the database holds the live keys and what two checkpoints apart write
            # flat: the live keys plus what two checkpoints apart write, far below the quota;
            # over the second half of the load (half the bytes) it grows by a small fraction of
            # what is written, where without compaction it would grow by all of it
            half = len(after_first) // 2
            growth = max(after_first[half:]) - max(after_first[:half])
            assert half >= 5 and growth <= 0.02 * written, sizes
            assert max(after_first) < QUOTA, sizes
            assert written >= 10 * QUOTA
            r = col.search(rng.standard_normal((5, DIM)).astype(np.float32), 10)
            assert (r.ids >= 0).all()
            assert len(col) <= len(pool)
            print(f"{writes} upserts, {written / 2**20:.1f} MiB of router log, etcd database at "
                  f"most {max(after_first[:half]) / 2**20:.2f} MiB in the first half, "
                  f"{max(after_first[half:]) / 2**20:.2f} MiB in the second (quota "
                  f"{QUOTA >> 20} MiB)")
    finally:
        etcd.stop()


def test_a_router_checkpoint_larger_than_a_blob_is_stored_in_pieces(tmp_path, monkeypatch):
    """A router larger than one blob (a shard keeps at most 1 GiB each; about 40M items)
    never checkpointed, so its log was never trimmed. Checkpoints are now cut into
    blobs of at most CHECKPOINT_CHUNK_BYTES; here 4 KiB blobs stand in for 1 GiB ones (a
    router of 1 GiB is not made in a test). A standby coordinator in this process takes over,
    checkpoints the router in pieces, and a coordinator that starts afterwards loads it from
    them and answers as the leader does. With the pieces joined wrongly (only the first read
    back) this test failed on the checkpoint's checksum."""
    import json
    import signal

    from simsearch.pyramid import checkpoints
    from simsearch.pyramid.coordinator import Coordinator

    monkeypatch.setattr(checkpoints, "CHECKPOINT_CHUNK_BYTES", 4096)
    rng = np.random.default_rng(5)
    coords = []
    with LocalCluster(tmp_path / "cl", 2, 2, "--coordinators", "1", "--lease-ttl", "2",
                      "--no-restart") as cl:
        with ss.connect(cl.coordinator, timeout=30) as c:
            col = c.create_collection("docs", DIM, "l2", "pyramid", **PARAMS)
            col.train(rng.standard_normal((2000, DIM)).astype(np.float32))
        import os
        os.kill(cl.pid("coord-0"), signal.SIGKILL)
        up = cl.up

        def coordinator(address):
            co = Coordinator(Etcd(up["etcd"], f"simsearch/{up['cluster']}", timeout=2.0),
                             lease_ttl=2.0, replicas=2)
            coords.append(co.start(address))
            return co

        try:
            leader = coordinator("127.0.0.1:9")
            end = time.monotonic() + 30
            while not leader.is_leader() and time.monotonic() < end:
                time.sleep(0.1)
            docs = leader.get("docs")
            x = rng.standard_normal((3000, DIM)).astype(np.float32)
            docs.add(x, ids=np.arange(3000))
            docs.snapshot()
            meta = json.loads(leader.etcd.get("router/docs")[0])
            assert meta["chunks"] > 10 and meta["size"] > 10 * 4096
            for address in cl.shard_addresses:  # every holder keeps every piece
                with connect_shard(address, timeout=10) as s:
                    names = {b["name"] for b in s.list_blobs()}
                assert set(checkpoints.checkpoint_blobs(meta)) <= names
            follower = coordinator("127.0.0.1:10")
            q = x[::97]
            a, b = docs.search(q, 5), follower.get("docs").search(q, 5)
            np.testing.assert_array_equal(a.ids, b.ids)
            np.testing.assert_array_equal(a.ids[:, 0], np.arange(0, 3000, 97))
            assert len(follower.get("docs").current()) == 3000
        finally:
            for co in coords:
                co.close()

"""Faults across simulated hosts: etcd, every shard and every coordinator on its own network
namespace (tests/support/netns.py, tests/support/netcluster.py), under a steady write + read load
(tests/support/faultload.py). What single-box tests cannot show: a leader SIGKILLed under writes, a
leader's host cut off for 10 s, a shard added and drained under load (docs/cluster.md,
"Failure model"). Skips with the reason where namespaces cannot be made (not root, no iproute2).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

pytest.importorskip("grpc")
pytest.importorskip("etcd3")

from faultload import Load, vectors_for  # noqa: E402
from netns import Net, skip_reason, wait_for  # noqa: E402

_reason = skip_reason()
pytestmark = [pytest.mark.skipif(_reason is not None, reason=_reason or ""), pytest.mark.slow]

DIM, K, N_BASE = 16, 10, 2000
TTL = 2.0
SEED = 13
COLLECTION = "docs"
PARAMS = dict(n_centers=24, n_partitions=4, sub_index="flat")
SEARCH = dict(branching=4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    import simsearch as ss
    from netcluster import NetCluster

    net = Net()
    cl = None
    try:
        cl = NetCluster(net, tmp_path_factory.mktemp("netcluster"), shards=3, coordinators=3,
                        lease_ttl=TTL)
        assert wait_for(lambda: cl.leader() is not None, timeout=30)
        with ss.connect(cl.coordinator_addresses(), timeout=60) as c:
            col = c.create_collection(COLLECTION, DIM, "l2", "pyramid", **PARAMS)
            xb = vectors_for(np.arange(N_BASE), DIM, SEED)
            col.train(xb)
            col.add(xb, ids=np.arange(N_BASE))
        yield cl
    finally:
        if cl is not None:
            cl.close()
        net.close()


def make_load(cl, **kw) -> Load:
    # a client deadline above one take-over (about one TTL): a follower holds a write while the
    # leader changes and forwards it to the new one, instead of failing it (docs/cluster.md)
    return Load(cl.coordinator_addresses(), COLLECTION, DIM, seed=SEED, k=K, search_params=SEARCH,
                read_ids=np.arange(N_BASE), timeout=2 * TTL + 1.0, **kw)


def check_nothing_lost(load: Load) -> None:
    missing = load.verify()
    assert len(load.acked_ids()) > 0
    assert missing.size == 0, f"{missing.size} acknowledged ids not found: {missing[:20]}"


def test_leader_sigkill_under_load(cluster):
    """Writes resume on a new leader within 2 x TTL; 0 acknowledged writes lost; 0 failed reads."""
    old = cluster.leader()
    assert old is not None
    load = make_load(cluster).start()
    try:
        assert wait_for(lambda: len(load.log.acks) >= 10, timeout=30)
        t_kill = time.monotonic()
        cluster.kill(old)
        assert wait_for(lambda: load.first_ack_after(t_kill) is not None, timeout=10 * TTL)
        resumed = load.first_ack_after(t_kill).t_ack - t_kill
        assert wait_for(lambda: cluster.leader() not in (None, old), timeout=10 * TTL)
        time.sleep(1.0)
    finally:
        load.stop()
    summary = load.summary()
    print("leader kill:", json.dumps(summary), f"writes resumed after {resumed:.2f} s")
    assert resumed < 2 * TTL, f"writes resumed {resumed:.2f} s after the kill (TTL {TTL} s)"
    assert summary["read_failures"] == 0, load.log.read_failures[:5]
    check_nothing_lost(load)
    cluster.restart(old)  # it rejoins as a follower
    assert wait_for(lambda: cluster.leader() not in (None, old), timeout=10)


ACK_PROBE = """
import json, sys, time
import numpy as np
sys.path.insert(0, sys.argv[4])
import simsearch as ss
from faultload import vectors_for
addr, dim, seed = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
col = ss.connect(addr, timeout=1.0).collection("docs")
next_id = 5_000_000
while True:  # writes straight to one coordinator, from its own host (the cut does not stop it)
    ids = np.arange(next_id, next_id + 5)
    t = time.monotonic()
    try:
        col.add(vectors_for(ids, dim, seed), ids=ids, upsert=True)
        print(json.dumps(["ack", t, time.monotonic(), int(ids[0])]), flush=True)
        next_id += 5
    except Exception as exc:
        print(json.dumps(["err", t, time.monotonic(), type(exc).__name__]), flush=True)
        time.sleep(0.05)
"""


def test_partition_of_the_leader_host(cluster):
    """The leader's host is cut for 10 s under load: it acknowledges nothing after its lease
    ends (checked by a writer on its own host), the others elect a leader and go on, and after
    the link returns it rejoins as a follower; nothing acknowledged is lost; 0 failed reads."""
    old = cluster.leader()
    host = cluster.hosts[old]
    probe_log: list = []
    tests_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                             "support")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    probe = host.run([sys.executable, "-c", ACK_PROBE, cluster.address(old), str(DIM), str(SEED),
                      tests_dir], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                     env=env)

    def pump():
        for line in probe.stdout:
            probe_log.append(json.loads(line))

    threading.Thread(target=pump, daemon=True).start()
    load = make_load(cluster).start()
    try:
        assert wait_for(lambda: len(load.log.acks) >= 10 and any(r[0] == "ack" for r in probe_log),
                        timeout=30)
        t_cut = time.monotonic()
        host.cut()
        assert wait_for(lambda: cluster.leader() not in (None, old), timeout=10 * TTL)
        new = cluster.leader()
        time.sleep(max(0.0, 10.0 - (time.monotonic() - t_cut)))
        host.heal()
        t_heal = time.monotonic()
        # after the heal the old leader is a follower: its writes are forwarded and acknowledged
        assert wait_for(lambda: any(r[0] == "ack" and r[1] > t_heal for r in probe_log), timeout=30)
        assert cluster.leader() == new
        time.sleep(1.0)
    finally:
        load.stop()
        os.killpg(probe.pid, signal.SIGKILL)
        probe.wait()
    # no write acknowledged by the cut-off leader after its lease ended: its last acknowledged
    # keepalive was sent before the cut, so the lease ends by t_cut + TTL (0.5 s: reply transport)
    late = [r for r in probe_log if r[0] == "ack" and t_cut + TTL + 0.5 < r[2] < t_heal]
    assert not late, f"{len(late)} writes acked by the cut-off leader after its lease: {late[:3]}"
    summary = load.summary()
    print("partition:", json.dumps(summary), "probe acks:",
          sum(r[0] == "ack" for r in probe_log), f"max write gap {load.max_write_gap():.2f} s")
    assert summary["read_failures"] == 0, load.log.read_failures[:5]
    # writes pause for about one take-over, not for the whole cut
    assert load.max_write_gap() < 3 * TTL, f"writes paused {load.max_write_gap():.1f} s"
    check_nothing_lost(load)
    probe_ids = np.concatenate([np.arange(r[3], r[3] + 5) for r in probe_log if r[0] == "ack"])
    missing = load.verify(probe_ids)
    assert missing.size == 0, f"probe writes lost: {missing[:10]}"


def _shard_parts(cl) -> dict[int, list[str]]:
    from simsearch.pyramid.control.errors import CoordinationError
    from simsearch.pyramid.status import cluster_status

    for attempt in range(5):  # this test's own etcd reads, on a machine the load fills
        try:
            st = cluster_status(cl.etcd_url, cl.name)
            break
        except CoordinationError:
            if attempt == 4:
                raise
            time.sleep(1.0)
    return {p["id"]: p["parts"] for p in st["processes"]
            if p["role"] == "shard" and p["state"] != "retired"}


def _recall(got: np.ndarray, gt: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(got, gt, strict=True)]))


def test_add_then_drain_a_shard_under_load(cluster):
    """Scale-out 3 -> 4 shards under load, then drain back to 3: 0 failed queries, recall at the
    same search parameters within 0.01 of before, the new shard holds its share of replicas."""
    import simsearch as ss

    # recall is measured on a second collection nobody writes to, so before and after see the
    # same data; the load reads and writes "docs" meanwhile
    xs = vectors_for(np.arange(3000), DIM, SEED + 7)
    rng = np.random.default_rng(SEED)
    q = (xs[rng.choice(3000, 100, replace=False)] + rng.normal(0, 0.3, (100, DIM))).astype(
        np.float32)
    d = (q**2).sum(1)[:, None] - 2 * q @ xs.T + (xs**2).sum(1)[None, :]
    gt = np.argsort(d, axis=1)[:, :K]
    with ss.connect(cluster.coordinator_addresses(), timeout=60) as c:
        static = c.create_collection("static", DIM, "l2", "pyramid", **PARAMS)
        static.train(xs)
        static.add(xs, ids=np.arange(3000))
        r3 = _recall(static.search(q, K, **SEARCH).ids, gt)
        before = _shard_parts(cluster)
        total = sum(len(v) for v in before.values())
        load = make_load(cluster).start()
        try:
            assert wait_for(lambda: len(load.log.acks) >= 5, timeout=30)
            role = cluster.add_shard()
            new = (set(_shard_parts(cluster)) - set(before)).pop()
            # balanced: every shard holds total/4 replicas (within one)
            assert wait_for(lambda: len(_shard_parts(cluster).get(new, [])) >= total // 4,
                            timeout=60), _shard_parts(cluster)
            after = _shard_parts(cluster)
            assert sum(len(v) for v in after.values()) == total  # the replication factor held
            assert max(map(len, after.values())) - min(map(len, after.values())) <= 1
            r4 = _recall(static.search(q, K, **SEARCH).ids, gt)
            drain = subprocess.run(
                [sys.executable, "-m", "simsearch.cli", "cluster", "drain", str(new), "--etcd",
                 cluster.etcd_url, "--cluster", cluster.name, "--timeout", "60"],
                capture_output=True, text=True, timeout=120, env=dict(
                    os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
            assert drain.returncode == 0, drain.stdout + drain.stderr
            assert cluster.procs[role].wait(30) == 0  # the retired shard stopped by itself
            drained = _shard_parts(cluster)
            assert new not in drained and sum(len(v) for v in drained.values()) == total
            r3b = _recall(static.search(q, K, **SEARCH).ids, gt)
            time.sleep(1.0)
        finally:
            load.stop()
        c.drop_collection("static")
    summary = load.summary()
    print("scale-out + drain:", json.dumps(summary), f"recall@{K} 3 shards {r3:.4f}, "
          f"4 shards {r4:.4f}, drained {r3b:.4f}; replicas per shard {before} -> {after} -> "
          f"{drained}")
    assert summary["read_failures"] == 0, load.log.read_failures[:5]
    assert abs(r4 - r3) <= 0.01 and abs(r3b - r3) <= 0.01
    check_nothing_lost(load)


def test_leader_cut_from_etcd_only(cluster):
    """Only the leader <-> etcd link is cut (nftables inside the leader's namespace), for 3
    lease TTLs, under updates and removes: the leader still reaches the shards, so writes it
    has in flight do reach them, but it cannot commit them (the log append is fenced in etcd)
    and, once the new leader has fenced the replicas, cannot prepare more. Judged by the
    clients' histories (tests/support/history.py): every id's state explained, replicas agree, no
    ghosts. Defect it catches: unfenced part writes from a deposed leader that can still reach
    the shards (seen failing before fenced part writes: ghosts and replicas that differ)."""
    from history import History

    old = cluster.leader()
    host = cluster.hosts[old]
    etcd_ip = cluster.hosts["etcd"].ip
    h = History(cluster.coordinator_addresses(), COLLECTION, DIM, np.arange(3_000_000, 3_000_300),
                seed=SEED + 1,
                timeout=2 * TTL + 1.0, give_up=30.0, search_params=SEARCH)
    h.load_initial()
    h.start()
    rules = ["add table inet cut", "add chain inet cut out { type filter hook output priority 0; }",
             "add chain inet cut in { type filter hook input priority 0; }",
             f"add rule inet cut out ip daddr {etcd_ip} drop",
             f"add rule inet cut in ip saddr {etcd_ip} drop"]
    try:
        time.sleep(2.0)
        for rule in rules:
            r = host.exec(["nft", *rule.split()])
            assert r.returncode == 0, r.stderr
        assert wait_for(lambda: cluster.leader() not in (None, old), timeout=10 * TTL)
        time.sleep(max(0.0, 3 * TTL))
    finally:
        host.exec(["nft", "delete", "table", "inet", "cut"])
        t_heal = time.monotonic()
        time.sleep(3.0)
        h.stop()
    report = h.check(cluster.etcd_url, cluster.name, cluster.address(cluster.leader()))
    print("leader-etcd cut:", json.dumps({k: v if isinstance(v, (int, dict)) else v[:10]
                                          for k, v in report.items()}))
    assert report["outcomes"].get("ok", 0) > 10, report["outcomes"]
    for key in ("violations", "diverged", "ghosts", "lost", "in_two_parts", "unknown_version"):
        assert report[key] == [], f"{key}: {report[key][:10]}"
    assert h.read_outage(t_heal) < 10.0

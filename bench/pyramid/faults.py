"""Throughput over time through a leader kill, a partition of the leader's host and a scale-out
(and drain), on a cluster whose etcd, shards and coordinators each run on their own simulated host
(network namespaces; needs root). The same scenarios as tests/pyramid/test_netns_faults.py, run
longer, plotted for docs/bench/pyramid.md ("Faults on the etcd control plane").

    flock /tmp/simsearch-bench.lock python bench/pyramid/faults.py --seconds 130

Timeline (seconds after the load starts): SIGKILL the leader at --kill-at, restart it 10 s later
(it rejoins as a follower); cut the then leader's host at --cut-at for --cut-for seconds; add a
fourth shard at --add-at; drain it at --drain-at. At the end every acknowledged id is searched
(it must be its own nearest neighbour) and recall@10 against exact search is compared between the
3-shard and 4-shard layouts at the same search parameters.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from faultload import Load, plot_series, vectors_for  # noqa: E402
from netns import Net, skip_reason  # noqa: E402

log = logging.getLogger("bench.pyramid.faults")

COLLECTION = "docs"
#: the faults' times, seconds after the load starts (the docstring's timeline)
TIMELINE = {"kill-at": 15, "cut-at": 45, "cut-for": 10, "add-at": 70, "drain-at": 100}


def recall(cl, ids: np.ndarray, dim: int, seed: int, n_queries: int, k: int,
           params: dict) -> float:
    """Recall@k of perturbed stored vectors as queries, against exact L2 over ``ids`` (every id
    stored: the base and every acknowledged write)."""
    import simsearch as ss

    rng = np.random.default_rng(seed + 1)
    xb = vectors_for(ids, dim, seed)
    pick = rng.choice(len(ids), n_queries, replace=False)
    q = (xb[pick] + rng.normal(0, 0.3, (n_queries, dim))).astype(np.float32)
    d = (q**2).sum(1)[:, None] - 2 * q @ xb.T + (xb**2).sum(1)[None, :]
    gt = ids[np.argsort(d, axis=1)[:, :k]]
    with ss.connect(cl.coordinator_addresses(), timeout=60) as c:
        res = c.collection(COLLECTION).search(q, k, **params)
    hits = [len(set(r) & set(g)) for r, g in zip(res.ids.tolist(), gt.tolist(), strict=True)]
    return float(np.sum(hits) / (k * n_queries))


def drain(cl, role: str) -> subprocess.CompletedProcess:
    shard_id = role.split("-")[1]
    return subprocess.run([sys.executable, "-m", "simsearch.cli", "cluster", "drain", shard_id,
                           "--etcd", cl.etcd_url, "--cluster", cl.name],
                          capture_output=True, text=True, timeout=300)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=130)
    ap.add_argument("--ttl", type=float, default=3.0, help="coordinators' lease TTL (s)")
    for name, seconds in TIMELINE.items():
        ap.add_argument(f"--{name}", type=float, default=seconds)
    ap.add_argument("--n-base", type=int, default=5000)
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--readers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=13)
    ap.add_argument("--out", default=str(ROOT / "docs/img/pyramid_faults_etcd.png"))
    ap.add_argument("--json", default=str(ROOT / "bench/results/pyramid_faults_etcd.json"))
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    reason = skip_reason()
    if reason:
        print(f"cannot run: {reason}", file=sys.stderr)
        return 2

    import simsearch as ss
    from netcluster import NetCluster

    params = dict(n_centers=32, n_partitions=4, sub_index="flat")
    search = dict(branching=4)
    k = 10
    work = Path(tempfile.mkdtemp(prefix="pyr-faults-"))
    net = Net()
    cl = None
    events: list[tuple[float, str]] = []
    out: dict = {"args": vars(args)}
    try:
        cl = NetCluster(net, work, shards=3, coordinators=3, lease_ttl=args.ttl)
        t_wait = time.monotonic()
        while cl.leader() is None and time.monotonic() - t_wait < 60:
            time.sleep(0.2)
        with ss.connect(cl.coordinator_addresses(), timeout=120) as c:
            col = c.create_collection(COLLECTION, args.dim, "l2", "pyramid", **params)
            xb = vectors_for(np.arange(args.n_base), args.dim, args.seed)
            col.train(xb)
            col.add(xb, ids=np.arange(args.n_base))
        base_ids = np.arange(args.n_base)
        out["recall_3_shards_before"] = recall(cl, base_ids, args.dim, args.seed, 200, k, search)
        load = Load(cl.coordinator_addresses(), COLLECTION, args.dim, seed=args.seed, k=k,
                    search_params=search, read_ids=np.arange(args.n_base),
                    timeout=2 * args.ttl + 1.0,  # above one take-over (docs/cluster.md)
                    readers=args.readers).start()

        def at(t):
            time.sleep(max(0.0, load.t0 + t - time.monotonic()))
            return time.monotonic() - load.t0

        # leader kill
        old = cl.leader()
        t = at(args.kill_at)
        cl.kill(old)
        events.append((t, f"SIGKILL leader {old}"))
        t_kill = load.t0 + t
        t = at(args.kill_at + 10)
        first = load.first_ack_after(t_kill)
        out["kill"] = {"leader": old, "writes_resumed_after_s": first and first.t_ack - t_kill}
        cl.restart(old)
        events.append((time.monotonic() - load.t0, f"{old} back (follower)"))
        # partition of the current leader's host
        old = cl.leader()
        t = at(args.cut_at)
        cl.hosts[old].cut()
        t_cut = load.t0 + t
        events.append((t, f"cut {old}"))
        t = at(args.cut_at + args.cut_for)
        cl.hosts[old].heal()
        events.append((t, f"heal {old}"))
        first = load.first_ack_after(t_cut)
        out["cut"] = {"leader": old, "writes_resumed_after_s": first and first.t_ack - t_cut,
                      "new_leader": cl.leader()}
        # scale-out and drain
        t = at(args.add_at)
        added = cl.add_shard()
        events.append((t, f"add {added}"))
        t = at(args.drain_at)
        stored = np.concatenate([base_ids, load.acked_ids()])
        out["recall_4_shards"] = recall(cl, stored, args.dim, args.seed, 200, k, search)
        r = drain(cl, added)
        events.append((t, f"drain {added}"))
        out["drain"] = {"rc": r.returncode, "stderr": r.stderr[-2000:]}
        at(args.seconds)
        load.stop()
        stored = np.concatenate([base_ids, load.acked_ids()])
        out["recall_3_shards_after"] = recall(cl, stored, args.dim, args.seed, 200, k, search)
        out["summary"] = load.summary()
        out["lost"] = int(load.verify().size)
        series = load.series()
        out["series"] = {key: v.tolist() for key, v in series.items()}
        out["events"] = events
        out["max_write_gap_s"] = load.max_write_gap()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        plot_series(series, events, args.out,
                    f"Pyramid cluster on etcd: 3 coordinators, 3(+1) shards, each on its own "
                    f"simulated host; lease TTL {args.ttl:g} s")
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
        print(json.dumps({k: v for k, v in out.items() if k not in ("series",)}, indent=1,
                         default=float))
    finally:
        if cl is not None:
            cl.close()
        net.close()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(1))
    sys.exit(main())

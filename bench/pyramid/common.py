"""What the Pyramid cluster benchmarks share: a local cluster, the data, the build, the naive
scheme and the closed-loop driver (bench/pyramid/bench.py runs them)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.pyramid.launcher import LocalCluster

RESULTS = Path("bench/results")
K = 10


class Cluster(LocalCluster):
    """A local cluster with the CPU time of its processes by role."""

    def extra_coordinator(self, *args: str) -> str:
        """Start one more coordinator of this cluster with these extra command-line arguments
        (say ``--search-batches 0``); its address. Stopped with the cluster; its CPU counts as
        the coordinators'."""
        import json
        import subprocess
        import sys

        i = len(getattr(self, "_extra", []))
        ready = self.dir / f"extra-coordinator-{i}.ready"
        ready.unlink(missing_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-m", "simsearch.pyramid.cli", "cluster", "coordinator",
             "--etcd", self.up["etcd"], "--cluster", self.up["cluster"], "--host", "127.0.0.1",
             "--port", "0", "--ready-file", str(ready), "--log-level", "WARNING",
             "--threads", "1", "--workers", "16", "--allow-unsafe-etcd", *args],
            stdout=subprocess.DEVNULL, stderr=open(self.dir / f"extra-coordinator-{i}.log", "ab"))
        self._extra = [*getattr(self, "_extra", []), proc]
        t0 = time.monotonic()
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() - t0 > 120:
                raise RuntimeError(f"the extra coordinator did not start (log in {self.dir})")
            time.sleep(0.1)
        return f"127.0.0.1:{json.loads(ready.read_text())['port']}"

    def stop(self) -> None:
        for proc in getattr(self, "_extra", []):
            proc.terminate()
            proc.wait(30)
        super().stop()

    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_role().values())

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the shard servers and of the coordinator(s)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {"shards": 0.0, "coord": 0.0}
        pids = [(r, i["pid"]) for r, i in self.up["processes"].items()]
        pids += [("extra-coordinator", p.pid) for p in getattr(self, "_extra", [])]
        for name, pid in pids:
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                out["shards" if name.startswith("shard") else "coord"] += (
                    int(f[11]) + int(f[12])) / tick
            except OSError:
                pass
        return out


def data(metric: str, n_base: int, n_queries: int):
    ds = load("glove-50", n_base=n_base, n_queries=n_queries)
    base, queries = ds.base, ds.queries
    f = ss.FlatIndex(50, metric)
    f.add(base)
    gt = f.search(queries, 100)
    return base, queries, gt


def build(cl: Cluster, base, metric, n_parts, n_centers, sub, mips_replicas=300,
          name="glove", **pyramid):
    """A Pyramid collection through the coordinator, trained and filled with ``base``;
    ``pyramid``: more of its parameters (``spill``, ``partition``)."""
    client = ss.connect(cl.coordinator, timeout=600)
    col = client.create_collection(name, 50, metric, "pyramid", n_centers=n_centers,
                                   n_partitions=n_parts, sub_index="hnsw",
                                   mips_replicas=mips_replicas, **pyramid, **sub)
    # k-means samples 100 x n_centers rows anyway; a subset keeps the call under gRPC's limit
    take = min(len(base), 200_000)
    col.train(base[np.random.default_rng(0).choice(len(base), take, replace=False)])
    for s in range(0, len(base), 20000):
        col.add(base[s : s + 20000], ids=np.arange(s, min(len(base), s + 20000)))
    return client, col


class Naive:
    """Random sharding over the same servers; every query to every shard, merged here."""

    def __init__(self, addresses, base, metric, sub, seed=0):
        self.clients = [ss.connect(a, timeout=600) for a in addresses]
        self.metric = metric
        part = np.random.default_rng(seed).integers(0, len(addresses), len(base))
        self.cols = []
        for j, c in enumerate(self.clients):
            col = c.create_collection("naive", 50, metric, "hnsw", **sub)
            rows = np.flatnonzero(part == j)
            for s in range(0, rows.size, 20000):
                col.add(base[rows[s : s + 20000]], ids=rows[s : s + 20000])
            self.cols.append(col)
        self.pool = ThreadPoolExecutor(32)

    def search(self, q, k, **params):
        from simsearch._kernels import merge_topk

        rs = list(self.pool.map(lambda c: c.search(q, k, **params), self.cols))
        ids = np.concatenate([r.ids for r in rs], axis=1)
        sc = np.concatenate([r.scores for r in rs], axis=1)
        return ss.SearchResult(*merge_topk(ids, sc, k, self.metric != "l2"))


def closed_loop(search, queries, clients: int, seconds: float, cl: Cluster, batch: int = 1):
    """(calls' queries, wall seconds, CPU seconds by role) with ``clients`` threads each sending
    ``batch`` queries per call for ``seconds``; CPU of every process involved (shard servers,
    coordinator, and this client)."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    nb = len(queries) // batch

    def worker(t):
        i = t
        while time.monotonic() < stop:
            j = i % nb
            search(queries[j * batch : (j + 1) * batch])
            counts[t] += batch
            i += clients

    cpu0, me0, t0 = cl.cpu_by_role(), time.process_time(), time.monotonic()
    ths = [threading.Thread(target=worker, args=(t,)) for t in range(clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.monotonic() - t0
    cpu1 = cl.cpu_by_role()
    cpu = {r: cpu1[r] - cpu0[r] for r in cpu0}
    cpu["client"] = time.process_time() - me0
    return sum(counts), wall, cpu



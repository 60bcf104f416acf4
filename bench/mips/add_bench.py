"""Add throughput of the norm-ordered indexes: small batches into a large index, as a service
sees them (each add used to re-sort and copy every item).

    flock /tmp/simsearch-bench.lock python bench/mips/add_bench.py [--n 1000000] [--batch 10]

Per kind: build on n synthetic-longtail items (64-d), then time ``--adds`` adds of ``--batch``
new items each; prints adds/s and items/s, and the search q/s after them (1,000 queries, k 10)
beside the q/s right after the build (the unsorted tail costs searches a little).
"""

from __future__ import annotations

import argparse
import json
import time

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import best_time, thread_limit


def run(kind: str, n: int, batch: int, adds: int) -> dict:
    x, q = synthetic_longtail(n=n + batch * adds, dim=64, n_queries=1000, seed=0)
    idx = ss.create_index(kind, 64, "ip", **({"n_lists": 1000} if kind == "norm-ivf" else {}))
    if idx.capabilities.needs_training:
        idx.train(x[:n])
    idx.add(x[:n])
    params = {"n_probe": 32} if kind == "norm-ivf" else {}
    qps_before = len(q) / best_time(lambda: idx.search(q, 10, **params), repeats=3)
    t = time.perf_counter()
    for i in range(adds):
        s = n + i * batch
        idx.add(x[s : s + batch])
    took = time.perf_counter() - t
    qps_after = len(q) / best_time(lambda: idx.search(q, 10, **params), repeats=3)
    return {"kind": kind, "n": n, "batch": batch, "adds/s": adds / took,
            "items/s": adds * batch / took, "q/s after build": qps_before,
            "q/s after the adds": qps_after}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--adds", type=int, default=50)
    a = p.parse_args()
    with thread_limit(1):
        for kind in ("norm-scan", "norm-ivf"):
            print(json.dumps(run(kind, a.n, a.batch, a.adds)), flush=True)


if __name__ == "__main__":
    main()

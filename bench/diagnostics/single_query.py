"""Single-query search calls, one thread: what a node or a Pyramid part pays per request.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/single_query.py [--rounds 3]

Builds ip-NSW+ (defaults), NEQ with the 4-bit fast-scan (8 of 224 lists, re-rank 50) and a flat
index on synthetic-longtail 50,000 x 64 (the built indexes are kept in the temp directory, so a
before/after pair through bench/ab/sitecustomize.py searches the same ones), then times 1,000
held-out queries one call each, per round (after a warm-up pass), and prints each round's q/s
and the best round's: the machine's other tenants swing single rounds by 2x.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import thread_limit
from simsearch.graph import IPNSWPlus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    x, q = synthetic_longtail(n=50_000, dim=64, n_queries=1000, seed=0)
    tmp = Path(tempfile.gettempdir())
    builders = {
        "ip-NSW+ (defaults)": (lambda: IPNSWPlus(64), {}),
        "NEQ 4-bit fast-scan": (lambda: ss.create_index(
            "neq", 64, "ip", base="pq", n_codebooks=32, nbits=4, n_lists=224,
            keep_vectors=True, fast_scan=True), {"n_probe": 8, "rerank": 50}),
    }
    indexes = {}
    for name, (make, params) in builders.items():
        saved = tmp / f"simsearch-single-query-{name.split()[0].lower()}.ssx"
        if not saved.exists():
            idx = make()
            if not idx.is_trained:
                idx.train(x)
            idx.add(x)
            idx.save(saved)
        indexes[name] = (ss.load(saved), params)
    flat = ss.FlatIndex(64, "ip")
    flat.add(x)
    indexes["flat"] = (flat, {})
    best = dict.fromkeys(indexes, 0.0)
    with thread_limit(1):
        for idx, params in indexes.values():  # first calls load kernels and caches
            for i in range(100):
                idx.search(q[i : i + 1], 10, **params)
        for r in range(a.rounds):
            for name, (idx, params) in indexes.items():
                t = time.perf_counter()
                for i in range(len(q)):
                    idx.search(q[i : i + 1], 10, **params)
                qps = len(q) / (time.perf_counter() - t)
                best[name] = max(best[name], qps)
                print(f"round {r + 1}: {name}: {qps:,.0f} q/s", flush=True)
    for name, qps in best.items():
        print(f"best: {name}: {qps:,.0f} q/s")


if __name__ == "__main__":
    main()

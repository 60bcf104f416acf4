"""Exact MIPS: NormScanIndex (norm-ordered scan, Cauchy–Schwarz stop) against FlatIndex, one thread.

    python bench/mips/normscan_bench.py [--n 1000000] [--datasets NAME ...]

Both answer every query exactly (the script checks the ids agree); the table gives queries/s for a
batch of all queries and for one query per call, and the fraction of items the scan reads before
it may stop.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import markdown_table, thread_limit


def qps(fn, nq: int, min_seconds: float = 1.0) -> float:
    best, spent = 0.0, 0.0
    while spent < min_seconds or best == 0.0:
        t = time.perf_counter()
        fn()
        dt = time.perf_counter() - t
        spent += dt
        best = max(best, nq / dt)
    return best


def run(name: str, base: np.ndarray, queries: np.ndarray, k: int, one_at_a_time: int) -> dict:
    flat, ns = ss.FlatIndex(base.shape[1], "ip"), ss.NormScanIndex(base.shape[1])
    flat.add(base)
    ns.add(base)
    a, b = ns.search(queries, k), flat.search(queries, k)
    same = float((a.ids == b.ids).mean())
    single = queries[:one_at_a_time]
    row = {"dataset": name, "n": base.shape[0], "dim": base.shape[1], "k": k,
           "ids equal": f"{same:.4f}",
           "scanned": f"{ns.scan_fraction(queries, k):.3%}"}
    row["flat q/s (batch)"] = qps(lambda: flat.search(queries, k), len(queries))
    row["norm-scan q/s (batch)"] = qps(lambda: ns.search(queries, k), len(queries))
    row["flat q/s (1/call)"] = qps(lambda: [flat.search(q, k) for q in single], len(single))
    row["norm-scan q/s (1/call)"] = qps(lambda: [ns.search(q, k) for q in single], len(single))
    row["speed-up (batch)"] = row["norm-scan q/s (batch)"] / row["flat q/s (batch)"]
    row["speed-up (1/call)"] = row["norm-scan q/s (1/call)"] / row["flat q/s (1/call)"]
    print(f"[normscan] {name} done", file=sys.stderr, flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=1_000_000, help="synthetic-longtail items")
    p.add_argument("--datasets", nargs="+",
                   default=["synthetic-longtail", "ml100k-svd", "glove-50"])
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--one-at-a-time", type=int, default=200, help="queries timed one per call")
    args = p.parse_args(argv)
    rows = []
    with thread_limit(1):
        for name in args.datasets:
            params = {"n": args.n, "dim": 64, "n_queries": 1000} if name.startswith("synth") else {}
            d = load(name, **params)
            rows.append(run(name, d.base, d.queries, args.k, args.one_at_a_time))
    cols = ["dataset", "n", "dim", "k", "ids equal", "scanned", "flat q/s (batch)",
            "norm-scan q/s (batch)", "speed-up (batch)", "flat q/s (1/call)",
            "norm-scan q/s (1/call)", "speed-up (1/call)"]
    print(markdown_table(rows, cols))
    return 0


if __name__ == "__main__":
    sys.exit(main())

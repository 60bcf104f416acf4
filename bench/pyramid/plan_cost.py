"""What a write costs the router in process (docs/bench/pyramid.md, "The router as a value"):
planning an upsert of ``--batch`` items on a router of ``--n`` items (a Draft: remove, then
add) and installing it, median over ``--writes`` writes, for cosine and for MIPS lists.

    python -m bench.pyramid.plan_cost --n 100000 --batch 100
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from simsearch.pyramid import PyramidIndex


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--writes", type=int, default=50)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print("| metric | plan ms (p50) | install ms (p50) |\n|---|---|---|")
    for metric, extra in (("cosine", {}), ("ip", {"mips_replicas": 300})):
        x = rng.standard_normal((args.n, 50)).astype(np.float32)
        p = PyramidIndex(50, metric, n_centers=256, n_partitions=3, sub_index="flat", **extra)
        p.train(x[:20_000])
        d = p.draft()
        d.add(x, np.arange(args.n))
        p.install(d)  # the router only: this measures planning, not the parts
        times = []
        for _ in range(args.writes):
            ids = rng.choice(args.n, args.batch, replace=False)
            t0 = time.perf_counter()
            d = p.draft()
            d.remove(ids)
            d.add(x[ids] * 1.01, ids)
            t1 = time.perf_counter()
            p.install(d)
            times.append((t1 - t0, time.perf_counter() - t1))
        ms = np.median(np.asarray(times), axis=0) * 1e3
        print(f"| {metric} | {ms[0]:.2f} | {ms[1]:.2f} |")


if __name__ == "__main__":
    main()

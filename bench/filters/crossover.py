"""Where the planner's crossover lies: one index, one shared allow list, each plan forced in turn
(``filter_read_cost`` 0: always the index's own filtered search; infinite: always the exact scan
of the allowed rows). One thread, recall@10 against the exact filtered answer.

    python bench/filters/crossover.py                 # synthetic-longtail 200k x 64
    python bench/filters/crossover.py --dataset glove # glove-50 (ip), 400k
    python bench/filters/crossover.py --dataset glove --M 32 --kinds ipnsw-plus
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import markdown_table, thread_limit

K = 10


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", choices=("longtail", "glove"), default="longtail")
    ap.add_argument("--queries", type=int, default=500)
    ap.add_argument("--ef", type=int, default=64)
    ap.add_argument("--M", type=int, default=16, help="the graphs' links per node")
    ap.add_argument("--kinds", nargs="+", default=["hnsw", "ipnsw-plus", "ipnsw-plus float"])
    args = ap.parse_args(argv)
    if args.dataset == "longtail":
        d = load("synthetic-longtail", n=200_000, dim=64, n_queries=args.queries, seed=0)
    else:
        d = load("glove-50", n_queries=args.queries)
    x, q = d.base, d.queries
    n, dim = x.shape
    m = args.M
    kinds = {"hnsw": lambda: ss.HNSWIndex(dim, "ip", M=m, ef_construction=100),
             "ipnsw-plus": lambda: ss.create_index("ipnsw-plus", dim, "ip", M=m, progress=False),
             "ipnsw-plus float": lambda: ss.create_index("ipnsw-plus", dim, "ip", M=m,
                                                         progress=False, sq8=False)}
    kinds = {name: kinds[name]() for name in args.kinds}
    for idx in kinds.values():
        idx.add(x)
    flat = ss.FlatIndex(dim, "ip")
    flat.add(x)
    rng = np.random.default_rng(0)
    rows = []
    with thread_limit(1):
        for s in (0.5, 0.3, 0.2, 0.1, 0.05, 0.02):
            allow = np.flatnonzero(rng.random(n) < s)
            gt = flat.search(q, K, allow=allow).ids
            row = {"selectivity": f"{s:.0%}"}
            for name, idx in kinds.items():
                kept = type(idx).filter_read_cost
                for plan, cost in (("own search", 0.0), ("scan", float("inf"))):
                    type(idx).filter_read_cost = cost
                    idx.search(q[:50], K, allow=allow, ef=args.ef)
                    t = time.perf_counter()
                    r = idx.search(q, K, allow=allow, ef=args.ef)
                    qps = len(q) / (time.perf_counter() - t)
                    rec = np.mean([len(set(a) & set(b)) / K
                                   for a, b in zip(r.ids.tolist(), gt.tolist(), strict=True)])
                    row[f"{name}: {plan}"] = f"{qps:,.0f} ({rec:.2f})"
                type(idx).filter_read_cost = kept
                idx.search(q[:50], K, allow=allow, ef=args.ef)
                t = time.perf_counter()
                idx.search(q, K, allow=allow, ef=args.ef)
                row[f"{name}: planner"] = f"{len(q) / (time.perf_counter() - t):,.0f}"
            rows.append(row)
            print(row, flush=True)
    print(f"\n{args.dataset}: {n} x {dim}, {len(q)} queries sharing one allow list, "
          f"M={m}, ef={args.ef}, one thread; q/s (recall@10)")
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

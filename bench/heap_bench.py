"""Search speed of every numba kernel that keeps a top-k in simsearch._heap (one heap
module; run on the code before and after to compare).

    flock /tmp/simsearch-bench.lock python bench/heap_bench.py

One thread, synthetic-longtail 100,000 x 64, 1,000 queries, k = 10 (and k = 100 for the exact
scans); best of 5. Prints one JSON line per kernel: ms per query.
"""

from __future__ import annotations

import json

import numpy as np

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import best_time, thread_limit


def main() -> None:
    x, q = synthetic_longtail(n=100_000, dim=64, n_queries=1000, seed=0)
    cases = [
        ("flat (topk_rows)", ss.FlatIndex(64, "ip"), {}, (10, 100)),
        ("norm-scan (heap_push_block)", ss.create_index("norm-scan", 64, "ip"), {}, (10, 100)),
        ("norm-ivf (scan_norm_lists)", ss.create_index("norm-ivf", 64, "ip", n_lists=316),
         {"n_probe": 16}, (10, 100)),
        ("nr-lsh (search_one)", ss.create_index("nr-lsh", 64, "ip", n_bits=16, n_ranges=32),
         {"n_probe_items": 5000}, (10,)),
        ("neq (scan, numba)", ss.create_index("neq", 64, "ip", base="pq", n_codebooks=16,
                                              nbits=8, n_lists=316, progress=False),
         {"n_probe": 16}, (10,)),
    ]
    with thread_limit(1):
        for name, idx, params, ks in cases:
            if idx.capabilities.needs_training:
                idx.train(x)
            idx.add(x)
            for k in ks:
                idx.search(q[:10], k, **params)  # compile
                secs = best_time(lambda i=idx, k=k, p=params: i.search(q, k, **p), repeats=5)
                print(json.dumps({"kernel": name, "k": k, "ms/query": 1e3 * secs / len(q)}),
                      flush=True)


if __name__ == "__main__":
    np.random.seed(0)
    main()

"""What the Index base's reader-writer lock costs a one-query search, one thread.

    python bench/diagnostics/lock_overhead.py                       # this checkout
    PYTHONPATH=<checkout of ab8a244>/src python bench/diagnostics/lock_overhead.py   # before

Diagnosed at commit 200255b: flat 10,000 x 64 "ip" 39.0 -> 40.5 us per call, hnsw (ef 32)
22.6 -> 24.1 us: about 1-1.5 us per call for the lock, under 0.2% of a call over gRPC.
"""

import time

import numpy as np

import simsearch as ss

rng = np.random.default_rng(0)
x = rng.standard_normal((10000, 64)).astype(np.float32)
q = rng.standard_normal((2000, 64)).astype(np.float32)
out = {}
for kind, kw, sp in [("flat", {}, {}), ("hnsw", {"M": 16, "ef_construction": 100}, {"ef": 32})]:
    idx = ss.create_index(kind, 64, "ip", **kw)
    idx.add(x)
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for i in range(len(q)):
            idx.search(q[i], 10, **sp)
        best = min(best, (time.perf_counter() - t) / len(q))
    out[kind] = best * 1e6
print(" ".join(f"{k}={v:.1f}us" for k, v in out.items()))

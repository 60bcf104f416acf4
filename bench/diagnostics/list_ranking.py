"""NEQ 4-bit fast-scan on fi-300 with the lists ranked by the heap pass against numpy's
selection and a sort of the selected (simsearch._lists.rank takes the second for 16 lists or
more and 16 queries or more), alternated in one process, one thread.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/list_ranking.py

The peers bench's NEQ (151 codebooks, sqrt(n) lists, vectors kept), 40% of the lists probed and
50 candidates re-ranked (its best setting for recall 0.9 there), 1,000 held-out queries in one
batch; prints the best of six rounds per ranking.
"""

from __future__ import annotations

import math
import time

import numpy as np

import simsearch as ss
import simsearch.quant.neq as neq_module
from simsearch import datasets
from simsearch._kernels import topk_rows
from simsearch.eval import thread_limit


def heap_rank(q, centroids, list_norm, n_probe, ranking="norm"):
    """The heap pass for every size (the ranking before the selection)."""
    s = q @ centroids.T
    if ranking == "norm":
        s = s * list_norm[None, :]
    return topk_rows(np.ascontiguousarray(s, np.float32), n_probe, 1.0,
                     np.arange(s.shape[1], dtype=np.int64))[0]


def main() -> None:
    ds = datasets.load("fi-300", n_queries=1000)
    x, q = ds.base, ds.queries
    d, n = x.shape[1], x.shape[0]
    nl = max(4, int(math.sqrt(n)))
    idx = ss.create_index("neq", d, "ip", base="pq", n_codebooks=min(256, d // 2 + 1), nbits=4,
                          n_lists=nl, keep_vectors=True, fast_scan=True, progress=False)
    idx.train(x)
    idx.add(x)
    params = {"n_probe": round(0.4 * nl), "rerank": 50}
    ways = {"heap": heap_rank, "selection + sort": neq_module.rank}
    best = dict.fromkeys(ways, 0.0)
    with thread_limit(1):
        for fn in ways.values():  # warm up both
            neq_module.rank = fn
            idx.search(q, 10, **params)
        for _ in range(6):
            for name, fn in ways.items():
                neq_module.rank = fn
                t = time.perf_counter()
                idx.search(q, 10, **params)
                best[name] = max(best[name], len(q) / (time.perf_counter() - t))
    for name, qps in best.items():
        print(f"{name}: {qps:,.0f} q/s")


if __name__ == "__main__":
    main()

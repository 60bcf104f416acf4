"""ip-NSW+'s 8-bit walk with its node ids renumbered for locality, against the build order.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/graph_reorder.py DATASET METHOD

DATASET: glove-50 (100k), wordllama-256 or synthetic-longtail (200k); METHOD: rcm (reverse
Cuthill-McKee on the inner-product graph), bfs (from the angular entry) or random (a control).
Both graphs and every per-item array are permuted outside the index and the compiled walk is
called on each order in turn, one thread, best of 5 batch calls of 1,000 held-out queries; the
answers are mapped back to the same ids, so the recalls must agree. docs/kernels.md has the
numbers.
"""

from __future__ import annotations

import sys
import time

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import breadth_first_order, reverse_cuthill_mckee

from simsearch import _simd, datasets
from simsearch.eval import recall_at_k, thread_limit
from simsearch.graph import IPNSWPlus
from simsearch.graph.ipnsw_plus import _NO_QBLOCKS

LOADS = {"wordllama-256": {"n_queries": 1000},
         "glove-50": {"n_base": 100_000, "n_queries": 1000},
         "synthetic-longtail": {"n": 200_000, "n_queries": 1000}}


def permutation(method: str, links: np.ndarray, degree: np.ndarray, entry: int) -> np.ndarray:
    """New position i holds old position order[i]."""
    n = len(degree)
    valid = np.arange(links.shape[1])[None, :] < degree[:, None]
    a = sp.csr_matrix((np.ones(int(degree.sum()), np.int8),
                       (np.repeat(np.arange(n), degree), links[valid])), shape=(n, n))
    sym = (a + a.T).tocsr()
    if method == "rcm":
        return np.asarray(reverse_cuthill_mckee(sym, symmetric_mode=True), np.int64)
    if method == "bfs":
        seen = breadth_first_order(sym, entry, directed=False, return_predecessors=False)
        return np.concatenate([seen, np.setdiff1d(np.arange(n), seen)]).astype(np.int64)
    return np.random.default_rng(0).permutation(n)


def main(name: str, method: str) -> None:
    ds = datasets.load(name, **LOADS[name])
    gt = ds.ground_truth("ip", k=10)
    idx = IPNSWPlus(ds.base.shape[1], progress=False, ef_construction=200)
    idx.add(ds.base)
    n, g = len(idx), idx._agraph
    links, degree = idx._links[:n], idx._degree[:n]
    order = permutation(method, links, degree, int(g["entry"]))
    inv = np.empty(n, np.int64)
    inv[order] = np.arange(n)

    def remap(a):
        return np.ascontiguousarray(np.where(a >= 0, inv[np.maximum(a, 0)], -1), np.int32)

    def take(a):
        return np.ascontiguousarray(a[order])

    built = (idx._xb[:n], idx._codes[:n], idx._inv_norm[:n], idx._live[:n].view(np.uint8),
             g["links0"], g["degree0"], g["upper_links"], g["upper_degree"], g["upper_start"],
             g["entry"], g["max_level"], links, degree)  # fmt: skip
    renumbered = (take(built[0]), take(built[1]), take(built[2]), take(built[3]),
                  remap(g["links0"][order]), take(g["degree0"]), remap(g["upper_links"]),
                  g["upper_degree"], take(g["upper_start"]), int(inv[g["entry"]]),
                  g["max_level"], remap(links[order]), take(degree))  # fmt: skip
    orders = {"build order": (built, np.arange(n)), method: (renumbered, order)}
    nq = len(ds.queries)

    def search(arrays, back, ef):
        xb, codes, inv_norm, live, *graph = arrays
        pos = np.empty((nq, 10), np.int32)
        sc = np.empty((nq, 10), np.float32)
        nd = np.zeros((nq, 2), np.int64)
        _simd.graph_search(ds.queries, 10, ef, 1, ef, xb, codes, idx._vmin, idx._vstep,
                           inv_norm, live, *graph, *_NO_QBLOCKS, np.zeros((1, n), np.uint8),
                           np.zeros(1, np.uint8), pos, sc, nd, 1)  # fmt: skip
        return back[pos]

    with thread_limit(1):
        for ef in (16, 32, 64):
            rec, best = {}, dict.fromkeys(orders, float("inf"))
            for label, (arrays, back) in orders.items():
                rec[label] = recall_at_k(search(arrays, back, ef), gt[0], 10, gt_scores=gt[1],
                                         queries=ds.queries, base=ds.base, metric="ip")
            for _ in range(5):
                for label, (arrays, back) in orders.items():
                    t = time.perf_counter()
                    search(arrays, back, ef)
                    best[label] = min(best[label], time.perf_counter() - t)
            qps = {label: round(nq / s) for label, s in best.items()}
            print(f"{name} {method} ef {ef}: recall {rec}, q/s {qps}, "
                  f"{best['build order'] / best[method]:.3f}x", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

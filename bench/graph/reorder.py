"""A graph index with its items in walk order (``reorder()``) against the same index in
insertion order, one thread, recall@10 against the exact top-10.

    flock /tmp/simsearch-bench.lock python bench/graph/reorder.py \
        [--datasets glove-50 wordllama-256] [--n-base N] [--fast-scan] [--hnsw cosine]

One index per dataset (ip-NSW+ with its defaults: M = 32, the 8-bit walk; ``--fast-scan`` the
quantized graph; ``--hnsw METRIC``: ``HNSWIndex`` with its defaults, hnswlib's graph) is built
once and copied twice through ``to_bytes``/``loads``; one copy is reordered. The two answer
identically (same graph, renumbered), so the q/s ratio at each ef is a ratio at equal recall.
Each ef is timed in turn, best of five batch calls of the held-out queries.
"""

from __future__ import annotations

import argparse
import sys
import time

import simsearch as ss
from simsearch import datasets
from simsearch.eval import markdown_table, recall_at_k, thread_limit
from simsearch.graph import IPNSWPlus

EFS = [16, 32, 64, 128]


def run(name: str, n_base: int | None, fast_scan: bool, hnsw: str | None) -> list[dict]:
    load = {"n_queries": 1000} | ({"n_base": n_base} if n_base else {})
    if name == "synthetic-longtail":
        load = {"n_queries": 1000, "n": n_base or 100_000}
    ds = datasets.load(name, **load)
    metric = hnsw or "ip"
    gt = ds.ground_truth(metric, k=10)
    n, d = ds.base.shape
    t0 = time.perf_counter()
    built = ss.HNSWIndex(d, hnsw, reorder=False) if hnsw else \
        IPNSWPlus(d, progress=True, fast_scan=fast_scan, reorder=False)
    built.add(ds.base)
    blob = built.to_bytes()
    del built
    plain, walk = ss.loads(blob), ss.loads(blob)
    t1 = time.perf_counter()
    walk.reorder()
    took = time.perf_counter() - t1
    print(f"[reorder] {name}: {n:,} x {d} built in {t1 - t0:.0f} s, reordered in {took:.2f} s",
          file=sys.stderr, flush=True)
    rows = []
    for ef in EFS:
        a, b = plain.search(ds.queries, 10, ef=ef), walk.search(ds.queries, 10, ef=ef)
        same = float((a.ids == b.ids).mean())
        rec = recall_at_k(b.ids, gt[0], 10, gt_scores=gt[1], queries=ds.queries, base=ds.base,
                          metric=metric)  # fmt: skip
        best = {"insertion": float("inf"), "walk": float("inf")}
        for _ in range(5):
            for label, idx in (("insertion", plain), ("walk", walk)):
                t = time.perf_counter()
                idx.search(ds.queries, 10, ef=ef)
                best[label] = min(best[label], time.perf_counter() - t)
        nq = len(ds.queries)
        walk_kind = f"hnsw ({hnsw})" if hnsw else "quantized" if fast_scan else "sq8"
        rows.append({"dataset": f"{name} {n:,}", "walk": walk_kind,
                     "ef": ef, "recall@10": round(rec, 4), "same answers": round(same, 4),
                     "insertion order q/s": round(nq / best["insertion"]),
                     "walk order q/s": round(nq / best["walk"]),
                     "walk / insertion": round(best["insertion"] / best["walk"], 2)})
        print(f"[reorder] {rows[-1]}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["glove-50", "wordllama-256"])
    ap.add_argument("--n-base", type=int, help="keep the first N base items")
    ap.add_argument("--fast-scan", action="store_true", help="the quantized graph's walk")
    ap.add_argument("--hnsw", choices=["cosine", "l2", "ip"],
                    help="HNSWIndex under this metric instead of ip-NSW+")
    a = ap.parse_args()
    rows = []
    with thread_limit(1):
        for name in a.datasets:
            rows += run(name, a.n_base, a.fast_scan, a.hnsw)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

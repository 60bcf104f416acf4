"""ip-NSW+'s quantized graph (``fast_scan=True``) against its sq8 walk on the same graph, one
thread, recall@10 against the exact top-10.

    flock /tmp/simsearch-bench.lock python bench/graph/quantized.py \
        [--datasets wordllama-256 glove-50] [--codebooks 0 64] [--n N] [--dim D]

One index per dataset and codebook count (0: the default, dim // 2) is built with
``IPNSWPlus(d, fast_scan=True)``; the two walks differ only in how the inner-product stage scores
a node's neighbours (the node's blocks of 4-bit codes, or each neighbour's 8-bit row), so they
share the graph, the angular seeds and the exact re-rank of the beam. Each ef is timed in turn,
best of three batch calls of 1,000 held-out queries.
"""

from __future__ import annotations

import argparse
import sys
import time

from simsearch import datasets
from simsearch.eval import markdown_table, recall_at_k, thread_limit
from simsearch.graph import IPNSWPlus

EFS = [16, 24, 32, 48, 64, 96, 128]
LOADS = {"wordllama-256": {"n_queries": 1000}, "fi-300": {"n_queries": 1000},
         "glove-50": {"n_base": 100_000, "n_queries": 1000},
         "synthetic-longtail": {"n": 100_000, "n_queries": 1000}}


def run(name: str, codebooks: int, size: dict) -> list[dict]:
    ds = datasets.load(name, **(LOADS[name] | (size if name == "synthetic-longtail" else {})))
    gt = ds.ground_truth("ip", k=10)
    d = ds.base.shape[1]
    t0 = time.perf_counter()
    idx = IPNSWPlus(d, progress=True, fast_scan=True, fast_scan_codebooks=codebooks or None)
    idx.add(ds.base)
    build = time.perf_counter() - t0
    qg = idx._qgraph  # the bench switches the walk on the same graph
    per_item = idx.memory_bytes() / len(idx)
    print(f"[quantized] {name}: built in {build:.1f} s, {per_item:,.0f} bytes/item "
          f"({qg.nbytes(len(idx)) / len(idx):,.0f} of them the quantized graph)", file=sys.stderr)
    walks = {"sq8": None, "quantized": qg}
    rows = []
    for ef in EFS:
        rec, best = {}, dict.fromkeys(walks, float("inf"))
        for w, g in walks.items():
            idx._qgraph = g
            r = idx.search(ds.queries, 10, ef=ef)
            rec[w] = recall_at_k(r.ids, gt[0], 10, gt_scores=gt[1], queries=ds.queries,
                                 base=ds.base, metric="ip")  # fmt: skip
        for _ in range(3):
            for w, g in walks.items():
                idx._qgraph = g
                t = time.perf_counter()
                idx.search(ds.queries, 10, ef=ef)
                best[w] = min(best[w], time.perf_counter() - t)
        nq = len(ds.queries)
        rows.append({"dataset": name, "codebooks": qg.m, "ef": ef,
                     "sq8 recall": round(rec["sq8"], 4), "sq8 q/s": round(nq / best["sq8"]),
                     "quantized recall": round(rec["quantized"], 4),
                     "quantized q/s": round(nq / best["quantized"]),
                     "quantized / sq8 q/s": round(best["sq8"] / best["quantized"], 2)})
        print(f"[quantized] {rows[-1]}", file=sys.stderr, flush=True)
    idx._qgraph = qg
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["wordllama-256", "glove-50"])
    ap.add_argument("--codebooks", type=int, nargs="+", default=[0])
    ap.add_argument("--n", type=int, help="synthetic-longtail's items (default 100,000)")
    ap.add_argument("--dim", type=int, help="synthetic-longtail's dimension (default 64)")
    args = ap.parse_args()
    size = {k: v for k, v in (("n", args.n), ("dim", args.dim)) if v}
    rows = []
    with thread_limit(1):
        for name in args.datasets:
            for m in args.codebooks:
                rows += run(name, m, size)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

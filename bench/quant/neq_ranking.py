"""NEQ's coarse-list ranking on long-tailed norms: by q·c alone ("centroid") against the list's
largest norm times q·c ("norm"), beside faiss IndexIVFPQFastScan with exact re-ranking.

    python bench/quant/neq_ranking.py [--n 200000] [--lists 256]

Recall@10 (with re-ranking of the 100 best estimates) and one-thread queries/s per number of
probed lists; the same number of lists and PQ codes for NEQ and faiss.
"""

from __future__ import annotations

import argparse
import sys
import time

import faiss
import numpy as np

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import markdown_table, thread_limit
from simsearch.quant import NEQIndex


def recall(got: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(set(a) & set(b)) / truth.shape[1]
                          for a, b in zip(got, truth, strict=True)]))


def timed(fn, nq: int) -> tuple[np.ndarray, float]:
    best, out = float("inf"), None
    for _ in range(2):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, nq / best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--lists", type=int, default=256)
    p.add_argument("--probes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = p.parse_args(argv)
    base, queries = synthetic_longtail(n=args.n, dim=64, n_queries=1000, seed=0)
    flat = ss.FlatIndex(64, "ip")
    flat.add(base)
    truth = flat.search(queries, 10).ids
    neq = NEQIndex(64, "ip", base="pq", n_codebooks=16, nbits=8, n_lists=args.lists,
                   keep_vectors=True, progress=False)
    neq.train(base[: min(len(base), 100_000)])
    neq.add(base)
    ivf = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(64), 64, args.lists, 16, 4,
                                   faiss.METRIC_INNER_PRODUCT)
    ivf.train(base[: min(len(base), 100_000)])
    refine = faiss.IndexRefineFlat(ivf)  # wraps the empty index; adds go to both
    refine.add(base)
    refine.k_factor = 10.0  # the 100 best estimates re-scored exactly, as NEQ's rerank=100
    rows = []
    with thread_limit(1):
        for probe in args.probes:
            row = {"lists probed": probe}
            for rank in ("centroid", "norm"):
                got, qps = timed(lambda rank=rank, probe=probe: neq.search(
                    queries, 10, rerank=100, n_probe=probe, list_ranking=rank).ids, len(queries))
                row[f"NEQ {rank} recall"] = recall(got, truth)
                row[f"NEQ {rank} q/s"] = qps
            ivf.nprobe = probe
            (_, got), qps = timed(lambda: refine.search(queries, 10), len(queries))
            row["faiss IVFPQFastScan+refine recall"] = recall(got, truth)
            row["faiss q/s"] = qps
            rows.append(row)
            print(f"[neq-ranking] {probe} lists done", file=sys.stderr, flush=True)
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

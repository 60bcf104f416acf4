"""NormIVFIndex swept over its lists probed, one thread, beside FlatIndex.

    python bench/mips/normivf_bench.py [--datasets synthetic-longtail ml100k-svd glove-50]
                                       [--lists-factor 1 2] [--threads 2]

Per dataset (synthetic-longtail 200,000 x 64; glove-50 its 100,000 most frequent words with 1,000
held-out queries): n_lists = factor x sqrt(n); for each n_probe the recall@10 (tie-tolerant),
queries/s for the batch of queries, and the mean fraction of items scored (the rest skipped by
lists not visited and by the Cauchy–Schwarz stop inside each visited list). The "all" row visits
every list (exact; the script checks the ids against FlatIndex's). ``--threads N`` adds the
queries/s of the same searches with ``n_threads=N`` (the batch's queries over N numba threads).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import best_time, markdown_table, recall_at_k, thread_limit

K = 10


def run(name: str, factor: float, threads: int | None = None) -> list[dict]:
    params = {"n": 200_000, "dim": 64, "n_queries": 1000} if name.startswith("synth") else {}
    d = load(name, **params)
    base, queries = d.base, d.queries
    if name == "glove-50":
        base, queries = base[:100_000], queries[:1000]
    n = len(base)
    flat = ss.FlatIndex(base.shape[1], "ip")
    flat.add(base)
    truth = flat.search(queries, K)
    ivf = ss.NormIVFIndex(base.shape[1], n_lists=max(1, int(factor * np.sqrt(n))))
    ivf.train(base)
    ivf.add(base)
    rows = []
    with thread_limit(1):
        flat_qps = len(queries) / best_time(lambda: flat.search(queries, K), repeats=3)
        for n_probe in (1, 2, 4, 8, 16, 32, 64, None):
            got = ivf.search(queries, K, n_probe=n_probe)
            rec = recall_at_k(got.ids, truth.ids, K, gt_scores=truth.scores, queries=queries,
                              base=base, metric="ip")
            secs = best_time(lambda p=n_probe: ivf.search(queries, K, n_probe=p), repeats=3)
            scored = ivf.scored_fraction(queries, K, n_probe)
            if n_probe is None:
                rec = f"{rec:.4f} (ids = Flat: {(got.ids == truth.ids).mean():.4f})"
            rows.append({"dataset": name, "n": n, "n_lists": ivf.n_lists,
                         "n_probe": "all (exact)" if n_probe is None else n_probe,
                         "recall@10": rec, "scored": f"{scored:.2%}",
                         "q/s (1 thread)": len(queries) / secs,
                         "x FlatIndex": len(queries) / secs / flat_qps})
    if threads:
        with thread_limit(threads):
            for row, n_probe in zip(rows, (1, 2, 4, 8, 16, 32, 64, None), strict=True):
                secs = best_time(lambda p=n_probe: ivf.search(queries, K, n_probe=p,
                                                              n_threads=threads), repeats=3)
                row[f"q/s ({threads} threads)"] = len(queries) / secs
    print(f"[normivf] {name} done (FlatIndex {flat_qps:,.0f} q/s)", file=sys.stderr, flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+",
                   default=["synthetic-longtail", "ml100k-svd", "glove-50"])
    p.add_argument("--lists-factor", type=float, nargs="+", default=[1.0])
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    rows = [r for name in args.datasets for f in args.lists_factor
            for r in run(name, f, args.threads)]
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

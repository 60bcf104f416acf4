"""NEQ's coarse-list ranking on long-tailed norms: by q·c alone ("centroid") against the list's
largest norm times q·c ("norm"), beside faiss IndexIVFPQFastScan with exact re-ranking and ScaNN.

    python -m bench.quant.neq_ranking [--n 200000] [--lists 256]

Recall@10 (with re-ranking of the 100 best estimates) and one-thread queries/s per number of
probed lists; the same number of lists for NEQ, faiss and ScaNN (its tree's leaves), 100
candidates re-scored exactly by each. A second table reads each curve at recall 0.9 and 0.95
(log-linear between the measured points, simsearch.eval.value_at_recall).
"""

from __future__ import annotations

import argparse
import sys

import faiss

import simsearch as ss
from bench.adapters_scann import ScaNN
from simsearch.datasets import synthetic_longtail
from simsearch.eval import markdown_table, recall_at_k, thread_limit, timed, value_at_recall
from simsearch.quant import NEQIndex

_METHODS = ("NEQ centroid", "NEQ norm", "faiss IVFPQFastScan+refine", "ScaNN")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--lists", type=int, default=256)
    p.add_argument("--probes", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    args = p.parse_args(argv)
    base, queries = synthetic_longtail(n=args.n, dim=64, n_queries=1000, seed=0)
    train = base[: min(len(base), 100_000)]
    flat = ss.FlatIndex(64, "ip")
    flat.add(base)
    truth = flat.search(queries, 10).ids
    neq = NEQIndex(64, "ip", base="pq", n_codebooks=16, nbits=8, n_lists=args.lists,
                   keep_vectors=True, progress=False)
    neq.train(train)
    neq.add(base)
    ivf = faiss.IndexIVFPQFastScan(faiss.IndexFlatIP(64), 64, args.lists, 16, 4,
                                   faiss.METRIC_INNER_PRODUCT)
    ivf.train(train)
    refine = faiss.IndexRefineFlat(ivf)  # wraps the empty index; adds go to both
    refine.add(base)
    refine.k_factor = 10.0  # the 100 best estimates re-scored exactly, as NEQ's rerank=100
    scann = ScaNN("ip", n_leaves=args.lists, training_sample=len(train))
    scann.fit(base)
    print("[neq-ranking] built NEQ, faiss and ScaNN", file=sys.stderr, flush=True)
    rows, curves = [], {m: [] for m in _METHODS}
    with thread_limit(1):
        for probe in args.probes:
            ivf.nprobe = probe
            runs = {
                "NEQ centroid": lambda probe=probe: neq.search(
                    queries, 10, rerank=100, n_probe=probe, list_ranking="centroid").ids,
                "NEQ norm": lambda probe=probe: neq.search(
                    queries, 10, rerank=100, n_probe=probe, list_ranking="norm").ids,
                "faiss IVFPQFastScan+refine": lambda: refine.search(queries, 10)[1],
                "ScaNN": lambda probe=probe: scann.query(queries, 10, leaves=probe, reorder=100),
            }
            row = {"lists probed": probe}
            for name, run in runs.items():
                got, seconds = timed(run, repeats=2)
                qps = len(queries) / seconds
                r = recall_at_k(got, truth, 10)
                row[f"{name} recall"], row[f"{name} q/s"] = r, qps
                curves[name].append((r, qps))
            rows.append(row)
            print(f"[neq-ranking] {probe} lists done", file=sys.stderr, flush=True)
    print(markdown_table(rows, list(rows[0])))
    print()
    at = [{"method": m, **{f"q/s at recall {t}": value_at_recall(curves[m], t, below="none")
                           or "not reached" for t in (0.9, 0.95)}} for m in _METHODS]
    print(markdown_table(at, list(at[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

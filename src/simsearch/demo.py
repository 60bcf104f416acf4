"""`simsearch demo`: build exact and HNSW indexes on real data, print recall/QPS, write a plot."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from . import datasets
from .eval import best_time, markdown_table, plot_recall_qps, recall_at_k, thread_limit
from .flat import FlatIndex
from .hnsw import HNSWIndex

log = logging.getLogger(__name__)

#: (dataset, metric) pairs the demo runs; --full adds raw inner product on GloVe
DEFAULT_RUNS = [("ml100k-svd", "ip"), ("glove-50", "cosine")]
FULL_RUNS = DEFAULT_RUNS + [("glove-50", "ip")]
EFS = (10, 20, 40, 80, 160, 320)
NOTES = {
    "ml100k-svd": "Inner-product HNSW levels off near recall 0.8 here even with ef >= n: some "
    "true answers are unreachable in a graph built under inner product. "
    "simsearch.graph.IPNSWPlus and simsearch.lsh.NormRangingLSH are built for this case "
    "(docs/benchmarks.md).",
}
K = 10


def _measure(name, search, ds, gt, metric, params) -> dict:
    ids = search(ds.queries)
    rec = recall_at_k(
        ids, gt[0], K, gt_scores=gt[1], queries=ds.queries, base=ds.base, metric=metric
    )
    secs = best_time(lambda: search(ds.queries), repeats=3)
    return {
        "index": name,
        "params": params,
        "recall@10": rec,
        "QPS (1 thread)": len(ds.queries) / secs,
    }


def run_demo(
    out_dir: str | Path = "demo-results",
    full: bool = False,
    M: int = 16,
    ef_construction: int = 100,
) -> list[dict]:
    """Run the demo and return its rows; writes demo.md and one PNG per run into ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for name, metric in FULL_RUNS if full else DEFAULT_RUNS:
        ds = datasets.load(name)
        gt = ds.ground_truth(metric, k=K)
        n, d = ds.base.shape
        print(f"\n== {name} ({n:,} x {d}, {len(ds.queries):,} queries), metric {metric!r}")
        run_rows = []
        with thread_limit(1):
            flat = FlatIndex(d, metric)
            flat.add(ds.base)
            run_rows.append(
                _measure(
                    "exact (FlatIndex)",
                    lambda q, flat=flat: flat.search(q, K).ids,
                    ds,
                    gt,
                    metric,
                    "-",
                )
            )
        t = time.perf_counter()
        hnsw = HNSWIndex(d, metric, M=M, ef_construction=ef_construction, capacity=n)
        hnsw.add(ds.base)  # both cores
        build = time.perf_counter() - t
        print(f"HNSW M={M} ef_construction={ef_construction} built in {build:.1f} s (2 threads)")
        with thread_limit(1):
            for ef in EFS:
                r = _measure(
                    f"HNSW M={M}",
                    lambda q, ef=ef, hnsw=hnsw: hnsw.search(q, K, ef=ef).ids,
                    ds,
                    gt,
                    metric,
                    f"ef={ef}",
                )
                run_rows.append(r)
        for r in run_rows:
            r["dataset"] = f"{name} ({metric})"
        print(markdown_table(run_rows, ["index", "params", "recall@10", "QPS (1 thread)"]))
        if name in NOTES:
            print(NOTES[name])
        series = {
            "exact": [(run_rows[0]["recall@10"], run_rows[0]["QPS (1 thread)"])],
            f"HNSW M={M}": [(r["recall@10"], r["QPS (1 thread)"]) for r in run_rows[1:]],
        }
        png = plot_recall_qps(
            series, out / f"{name}-{metric}.png", f"{name} ({metric}), k={K}, one thread"
        )
        print(f"plot: {png}")
        rows += run_rows
    table = markdown_table(rows, ["dataset", "index", "params", "recall@10", "QPS (1 thread)"])
    (out / "demo.md").write_text(table + "\n")
    best = [r for r in rows if r["recall@10"] >= 0.9 and r["index"].startswith("HNSW")]
    if best:
        top = max(b["QPS (1 thread)"] for b in best)
        print(f"\nHNSW reaches recall@10 >= 0.9 at up to {top:,.0f} queries/s on one thread.")
    print(f"results: {out / 'demo.md'}")
    return rows

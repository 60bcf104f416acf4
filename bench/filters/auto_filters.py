"""Does ``auto_index`` keep its recall target under a filter? Its filtered recall@10 at 50%, 10%,
1% and 0.1% selectivity (random allow lists, shared by the batch) against the exact filtered
answer, beside the unfiltered one; one thread.

    flock /tmp/simsearch-bench.lock python bench/filters/auto_filters.py \
        [--datasets ml100k-svd glove-50 synthetic-longtail fi-300] [--target 0.9]

auto is given 200 random queries as its sample (as in bench/mips/peers_bench.py) and scored on
the others. "bound" is the 99% prediction bound auto's own promise is stated with
(``simsearch.auto.prediction_bound``): the mean recall of 1,000 new queries stays above it.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from simsearch import auto_index, create_index, datasets
from simsearch.auto import prediction_bound
from simsearch.eval import best_time, markdown_table, thread_limit

K = 10
N_SAMPLE = 200
SELECTIVITIES = (0.5, 0.1, 0.01, 0.001)
LOADS = {"fi-300": {"n_queries": 1200}, "wordllama-256": {"n_queries": 1200},
         "glove-50": {"n_base": 100_000, "n_queries": 1200},
         "synthetic-longtail": {"n": 200_000, "n_queries": 1200}, "ml100k-svd": {}}


def log(msg: str) -> None:
    print(f"[auto_filters] {msg}", file=sys.stderr, flush=True)


def per_query_recall(ids: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Hits of each row against the exact answer's valid ids (a short exact answer: its size)."""
    out = np.empty(len(ids))
    for i, (a, t) in enumerate(zip(ids, truth, strict=True)):
        t = t[t >= 0]
        out[i] = len(set(a[a >= 0].tolist()) & set(t.tolist())) / max(len(t), 1)
    return out


def run(name: str, target: float, seed: int = 0) -> list[dict]:
    ds = datasets.load(name, **LOADS[name])
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(ds.queries))
    sample, q = ds.queries[order[:N_SAMPLE]], np.ascontiguousarray(ds.queries[order[N_SAMPLE:]])
    n, d = ds.base.shape
    t = time.perf_counter()
    auto = auto_index(ds.base, "ip", target_recall=target, k=K, queries=sample, progress=False)
    log(f"{name}: auto chose {auto.chosen} in {time.perf_counter() - t:.0f} s")
    exact = create_index("flat", d, "ip")
    exact.add(ds.base)
    rows = []
    for s in (1.0, *SELECTIVITIES):
        allow = None if s == 1.0 else np.flatnonzero(rng.random(n) < s)
        truth = exact.search(q, K, allow=allow).ids
        with thread_limit(1):
            ids = auto.search(q, K, allow=allow).ids
            sec = best_time(lambda a=allow: auto.search(q, K, allow=a), repeats=3)
        rec = per_query_recall(ids, truth)
        rows.append({"dataset": name, "auto chose": auto.chosen,
                     "selectivity": "none" if s == 1.0 else f"{s:.1%}",
                     "allowed": n if allow is None else allow.size,
                     "recall@10": rec.mean(), "bound": prediction_bound(rec),
                     "target held": bool(rec.mean() >= target),
                     "q/s (1 thread)": len(q) / sec})
        log(f"{name} @ {rows[-1]['selectivity']}: recall {rec.mean():.4f}, "
            f"{len(q) / sec:,.0f} q/s")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(LOADS), choices=list(LOADS))
    ap.add_argument("--target", type=float, default=0.9)
    args = ap.parse_args()
    rows = [r for name in args.datasets for r in run(name, args.target)]
    print(markdown_table(rows, ["dataset", "auto chose", "selectivity", "allowed", "recall@10",
                                "bound", "target held", "q/s (1 thread)"]))


if __name__ == "__main__":
    main()

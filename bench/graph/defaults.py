"""ip-NSW+ as a new user builds it, ``IPNSWPlus(d)`` with every default, against hnswlib as its
README builds it (M = 16, ef_construction = 200; space "ip"), one thread, recall@10.

    flock /tmp/simsearch-bench.lock python bench/graph/defaults.py \
        [--datasets synthetic-longtail glove-50] [--targets 0.9 0.95]

Both sweep ef over the same grid on 1,000 held-out queries; per target the fastest setting that
reaches it is kept, and the two are then timed again in turn (best of 5 rounds of at least 0.2 s)
for the ratio. synthetic-longtail is 100,000 x 64, glove-50 its first 100,000 words.
"""

from __future__ import annotations

import argparse
import sys
import time

from simsearch import datasets
from simsearch.demo import K, hnswlib_ip, index_builder
from simsearch.eval import (
    alternated_best_times,
    best_time,
    markdown_table,
    recall_at_k,
    thread_limit,
)
from simsearch.graph import IPNSWPlus

EFS = [10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 192, 256]
LOADS = {"synthetic-longtail": {"n": 100_000, "n_queries": 1000},
         "glove-50": {"n_base": 100_000, "n_queries": 1000}}


def log(msg: str) -> None:
    print(f"[defaults] {msg}", file=sys.stderr, flush=True)


def builders(d: int):
    """label -> build(x) -> search(q, ef) -> ids, with its ``memory``."""
    ours = index_builder(lambda: IPNSWPlus(d, progress=False), lambda ef: {"ef": ef})
    return {"simsearch IPNSWPlus(d)": ours,
            "hnswlib (M=16, ef_construction=200)": hnswlib_ip(d, 16, 200)}


def run(name: str, targets: list[float]) -> list[dict]:
    ds = datasets.load(name, **LOADS[name])
    gi, gs = ds.ground_truth("ip", k=K)
    q, (n, d) = ds.queries, ds.base.shape
    searches, rows = {}, []
    for label, build in builders(d).items():
        t = time.perf_counter()
        search = build(ds.base)
        took = time.perf_counter() - t
        searches[label] = search
        sweep = []
        with thread_limit(1):
            for ef in EFS:
                rec = recall_at_k(search(q, ef), gi, K, gt_scores=gs, queries=q, base=ds.base,
                                  metric="ip")
                sweep.append((ef, rec, len(q) / best_time(lambda ef=ef, s=search: s(q, ef), 2)))
                if rec >= max(targets) + 0.02:
                    break
        log(f"{name}: {label} built in {took:.1f} s")
        for target in targets:
            ok = [s for s in sweep if s[1] >= target]
            best = max(ok, key=lambda s: s[2]) if ok else None
            rows.append({"dataset": name, "target": target, "method": label,
                         "ef": None if best is None else best[0],
                         "recall@10": None if best is None else best[1],
                         "q/s (sweep)": None if best is None else best[2],
                         "build s": took, "bytes/item": search.memory() / n})
    for target in targets:
        pair = [r for r in rows if r["dataset"] == name and r["target"] == target]
        if any(r["ef"] is None for r in pair):
            continue
        with thread_limit(1):
            times = alternated_best_times(
                [lambda r=r: searches[r["method"]](q, r["ef"]) for r in pair], rounds=5,
                min_seconds=0.2)
        for r, t in zip(pair, times, strict=True):
            r["q/s (alternated)"] = len(q) / t
        pair[0]["ours / hnswlib"] = times[1] / times[0]
        log(f"{name} @ {target}: ours / hnswlib {times[1] / times[0]:.2f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(LOADS), choices=list(LOADS))
    ap.add_argument("--targets", nargs="+", type=float, default=[0.9, 0.95])
    args = ap.parse_args()
    rows = [r for name in args.datasets for r in run(name, args.targets)]
    print(markdown_table(rows, ["dataset", "target", "method", "ef", "recall@10", "q/s (sweep)",
                                "q/s (alternated)", "ours / hnswlib", "build s", "bytes/item"]))


if __name__ == "__main__":
    main()

"""The table of ``auto_index`` against the peers a MIPS user would tune by hand.

    python bench/mips/auto_bench.py [--targets 0.9 0.95] [--longtail-n 200000]

Per dataset (ml100k-svd, glove-50 cut to 100,000 base words, synthetic-longtail) and per recall@10
target, one thread: hnswlib, faiss HNSW, ScaNN and the plain norm-first scan each sweep their knob
and the fastest setting reaching the target is kept; ``auto_index`` is given every fifth query as
its sample and every method is scored on the other four fifths (held out from auto's tuning).
The peers' builds and sweeps are the demo's (src/simsearch/demo.py), so the two tables agree.
"vs best peer" times auto and the fastest peer's setting again, alternated (best of 7 rounds of
at least 0.2 s each), since a sweep's best-of-two on a shared machine varies by ±15%.
"""

from __future__ import annotations

import argparse
import sys
import time
from types import SimpleNamespace

import numpy as np

from simsearch import auto_index, datasets
from simsearch.demo import K, _methods, _sweep
from simsearch.eval import alternated_best_times, markdown_table, thread_limit

PEERS = ("hnswlib (ip-NSW)", "faiss HNSW", "ScaNN (tree, AH, reorder)", "norm-scan (budget)")


def log(msg: str) -> None:
    print(f"[auto_bench] {msg}", file=sys.stderr, flush=True)


def run(name: str, params: dict, targets: list[float]) -> list[dict]:
    ds = datasets.load(name, **params)
    gt_ids, gt_scores = ds.ground_truth("ip", k=K)
    n, d = ds.base.shape
    sample = np.zeros(len(ds.queries), bool)
    sample[::5] = True
    held = SimpleNamespace(queries=np.ascontiguousarray(ds.queries[~sample]), base=ds.base)
    gt = (gt_ids[~sample], gt_scores[~sample])
    log(f"{name}: {n:,} x {d}; {sample.sum()} sample queries, {len(held.queries)} held out")
    fr = [0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75]
    sweeps, searches = {}, {}
    for label, build, knob, values in _methods(d, n):
        if label not in PEERS:
            continue
        if label == "norm-scan (budget)":
            values = sorted({max(K, int(f * n)) for f in fr})
        elif knob == "ef":
            values = [*values, 640]
        t = time.perf_counter()
        search = build(ds.base)
        log(f"{name}: {label} built in {time.perf_counter() - t:.1f} s")
        with thread_limit(1):
            sweeps[label] = _sweep(label, search, knob, values, held, gt)
        # a sweep stops early once recall is ~1, so its rows are a prefix of the values
        searches[label] = (search, {r["params"]: v
                                    for r, v in zip(sweeps[label], values, strict=False)})
    rows = []
    for target in targets:
        best_peer = None  # (q/s in its sweep, label, params)
        for label, sw in sweeps.items():
            ok = [r for r in sw if r["recall@10"] >= target]
            r = max(ok, key=lambda r: r["QPS (1 thread)"]) if ok else max(
                sw, key=lambda r: r["recall@10"])
            rows.append({"dataset": name, "target": target, "index": label,
                         "params": r["params"] if ok else f"{r['params']} (below target)",
                         "recall@10": r["recall@10"], "QPS (1 thread)": r["QPS (1 thread)"]})
            if ok and (best_peer is None or r["QPS (1 thread)"] > best_peer[0]):
                best_peer = (r["QPS (1 thread)"], label, r["params"])
        t = time.perf_counter()
        auto = auto_index(ds.base, "ip", target_recall=target, k=K, progress=False,
                          queries=ds.queries[sample], sample_size=min(n, 20_000))
        took = time.perf_counter() - t
        log(f"{name} @ {target}: auto chose {auto.chosen} in {took:.0f} s")
        with thread_limit(1):
            (r,) = _sweep("auto", lambda q, v, a=auto: a.search(q, K).ids, "-", [None], held, gt)
            ratio, note = float("nan"), "no peer reached the target"
            if best_peer:
                search, values = searches[best_peer[1]]
                v = values[best_peer[2]]
                t_auto, t_peer = alternated_best_times(
                    [lambda a=auto: a.search(held.queries, K),
                     lambda f=search, v=v: f(held.queries, v)], rounds=7, min_seconds=0.2)
                ratio = t_peer / t_auto
                note = (f"alternated: auto {len(held.queries) / t_auto:,.0f} q/s, "
                        f"{best_peer[1]} {len(held.queries) / t_peer:,.0f} q/s")
        log(f"{name} @ {target}: {note}")
        rows.append({"dataset": name, "target": target, "index": f"auto -> {auto.chosen}",
                     "params": f"built in {took:.0f} s; {note}",
                     "recall@10": r["recall@10"], "QPS (1 thread)": r["QPS (1 thread)"],
                     "vs best peer": ratio})
        print(f"\n### auto_index report, {name}, target {target}\n{auto.report}", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95])
    ap.add_argument("--longtail-n", type=int, default=200_000)
    ap.add_argument("--datasets", nargs="+",
                    default=["ml100k-svd", "glove-50", "synthetic-longtail"])
    a = ap.parse_args()
    loads = {"ml100k-svd": {}, "glove-50": {"n_base": 100_000, "n_queries": 1000},
             "synthetic-longtail": {"n": a.longtail_n}}
    rows = []
    for name in a.datasets:
        rows += run(name, loads[name], a.targets)
    print("\n" + markdown_table(rows, ["dataset", "target", "index", "params", "recall@10",
                                       "QPS (1 thread)", "vs best peer"]))


if __name__ == "__main__":
    main()

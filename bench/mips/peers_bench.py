"""MIPS against every peer, one thread, recall@10: the compiled kernels' done table.

    flock /tmp/simsearch-bench.lock python bench/mips/peers_bench.py \
        [--datasets fi-300 wordllama-256 glove-50 synthetic-longtail ml100k-svd] \
        [--targets 0.9 0.95] [--auto-confidence 0.99]

Per dataset, every method sweeps its knob over the same scored queries and the table keeps, per
target, the fastest measured setting whose recall@10 reaches it (no interpolation). simsearch:
ip-NSW+ (float and sq8 walks, the quantized graph), NEQ 4-bit fast-scan, norm-ivf, norm-scan
(the kernels before and after: bench/kernels_bench.py). Peers: ScaNN (tree + AH + reorder),
faiss HNSW, faiss HNSW-SQ8 + refine (faiss's RaBitQ graph takes L2 only), faiss IVFPQFastScan +
refine, faiss IVF-RaBitQ fast-scan + refine, hnswlib, usearch, glass (SQ8 walk + FP32 refine;
its memory: the process's growth while it builds). Then
``auto_index`` at each target is given 200 random queries as its sample and scored on the
others, like every method here (ml100k-svd: 743 scored queries; glove-50: 100,000 base words).
A plot per dataset goes to docs/img/peers-<dataset>.png.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch import auto_index, datasets
from simsearch.demo import faiss_hnsw, hnswlib_ip, index_builder, scann_tree
from simsearch.eval import (
    alternated_best_times,
    best_time,
    markdown_table,
    plot_recall_qps,
    recall_at_k,
    thread_limit,
)

K = 10
N_SAMPLE = 200
LOADS = {"fi-300": {"n_queries": 1200}, "wordllama-256": {"n_queries": 1200},
         "glove-50": {"n_base": 100_000, "n_queries": 1200},
         "synthetic-longtail": {"n": 200_000, "n_queries": 1200}, "ml100k-svd": {}}
EFS = [10, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 256, 384, 512]
# (share of the lists probed, candidates re-ranked exactly)
PAIRS = [(f, r) for f in (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5,
                          0.6, 0.7, 1.0)
         for r in (10, 20, 30, 50, 100, 200, 400)]


def resident_bytes() -> int:
    """This process's resident memory (Linux), after a collection."""
    import gc
    import os

    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def log(msg: str) -> None:
    print(f"[peers] {msg}", file=sys.stderr, flush=True)


def methods(d: int, n: int) -> list[tuple[str, object, list]]:
    """(label, build(x) -> search(q, knob) -> ids, knob values)."""
    import faiss

    nl = max(4, int(math.sqrt(n)))

    def probes(f):
        return max(1, round(f * nl))

    neq = index_builder(lambda: ss.create_index(
        "neq", d, "ip", base="pq", n_codebooks=min(256, d // 2 + 1), nbits=4, n_lists=nl,
        keep_vectors=True, fast_scan=True, progress=False),
        lambda v: {"n_probe": probes(v[0]), "rerank": v[1]})

    def faiss_ivf(spec):
        def build(x):
            idx = faiss.index_factory(d, spec, faiss.METRIC_INNER_PRODUCT)
            idx.train(x)
            idx.add(x)
            ivf = faiss.extract_index_ivf(idx.base_index)

            def search(q, v):
                ivf.nprobe = probes(v[0])
                idx.k_factor = max(1.0, v[1] / K)
                return idx.search(q, K)[1]
            search.memory = lambda: faiss.serialize_index(idx).nbytes
            return search
        return build

    def faiss_hnsw_sq8(x):
        """faiss's HNSW walking 8-bit codes (IndexHNSWSQ), its beam re-ranked exactly
        (IndexRefineFlat), as simsearch's default walk; faiss's RaBitQ graph takes L2 only."""
        idx = faiss.index_factory(d, "HNSW32_SQ8,RFlat", faiss.METRIC_INNER_PRODUCT)
        hnsw = faiss.downcast_index(idx.base_index)
        hnsw.hnsw.efConstruction = 200
        idx.train(x)
        idx.add(x)

        def search(q, ef):
            hnsw.hnsw.efSearch = max(ef, K)
            idx.k_factor = max(ef, K) / K  # the whole beam re-ranked, as ours
            return idx.search(q, K)[1]
        search.memory = lambda: faiss.serialize_index(idx).nbytes
        return search

    def usearch_(x):
        from usearch.index import Index

        u = Index(ndim=d, metric="ip", dtype="f32", connectivity=16, expansion_add=200)
        u.add(np.arange(len(x)), x, threads=2)

        def search(q, ef):
            u.expansion_search = max(ef, K)
            return np.asarray(u.search(q, K, threads=1).keys, np.int64)
        search.memory = lambda: u.memory_usage
        return search

    def glass_(x):
        import glass

        glass.set_num_threads(1)
        before = resident_bytes()
        g = glass.Index("HNSW", "IP", quant="FP32", R=32, L=200).build(x)
        s = glass.Searcher(g, x, "IP", "SQ8U", "FP32")
        s.optimize(1)  # its prefetch tuned on sample queries
        grown = resident_bytes() - before

        def search(q, ef):
            s.set_ef(max(ef, K))
            return np.asarray(s.batch_search(q, K, 1)[0], np.int64)
        search.memory = lambda: grown  # glass reports none: the process's growth in building it
        return search

    def scann_(x):
        search = scann_tree(400)(x)

        def memory():
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:  # ScaNN serializes to a directory only
                search.searcher.serialize(tmp)
                return sum(f.stat().st_size for f in Path(tmp).iterdir())
        search.memory = memory
        return search

    m4 = d // 2 if d % 2 == 0 else d
    fr = np.geomspace(0.002, 1.0, 25).tolist()  # budgets: shares of n, steps of 30%
    return [
        ("simsearch ip-NSW+ M=32 (sq8 walk)", index_builder(lambda: ss.create_index(
            "ipnsw-plus", d, "ip", M=32, ef_construction=200, progress=False, sq8=True),
            lambda v: {"ef": v}), EFS),
        ("simsearch ip-NSW+ M=32 (float walk)", index_builder(lambda: ss.create_index(
            "ipnsw-plus", d, "ip", M=32, ef_construction=200, progress=False, sq8=False),
            lambda v: {"ef": v}), EFS),
        ("simsearch ip-NSW+ M=32 (quantized graph)", index_builder(lambda: ss.create_index(
            "ipnsw-plus", d, "ip", M=32, ef_construction=200, progress=False, fast_scan=True),
            lambda v: {"ef": v}), EFS),
        ("simsearch NEQ fast-scan", neq, PAIRS),
        ("simsearch norm-ivf", index_builder(
            lambda: ss.create_index("norm-ivf", d, "ip", n_lists=nl), lambda v: {"n_probe": v}),
         [1, 2, 4, 8, 16, 32, 64, 128, 256]),
        ("simsearch norm-scan", index_builder(lambda: ss.create_index("norm-scan", d, "ip"),
                                              lambda v: {"max_items": max(K, int(v * n))}), fr),
        ("ScaNN (tree, AH, reorder)", scann_, PAIRS),
        ("faiss HNSW", faiss_hnsw(d, 32, 200), EFS),
        ("faiss HNSW-SQ8 + refine", faiss_hnsw_sq8, EFS),
        ("faiss IVFPQFastScan + refine", faiss_ivf(f"IVF{nl},PQ{m4}x4fs,RFlat"), PAIRS),
        ("faiss IVF-RaBitQ fast-scan + refine", faiss_ivf(f"IVF{nl},RaBitQfs,RFlat"), PAIRS),
        ("hnswlib", hnswlib_ip(d), EFS),
        ("usearch", usearch_, EFS),
        ("glass (SQ8 + refine)", glass_, EFS),
    ]


def sweep(search, values, q, gt, base) -> list[tuple[object, float, float]]:
    """(value, recall, q/s) per value; stops once recall is ~1."""
    out = []
    for v in values:
        ids = search(q, v)
        rec = recall_at_k(ids, gt[0], K, gt_scores=gt[1], queries=q, base=base, metric="ip")
        secs = best_time(lambda v=v: search(q, v), repeats=2)
        out.append((v, rec, len(q) / secs))
        if rec >= 0.999:
            break
    return out


def run(name: str, targets: list[float], img: Path, confidence: float = 0.99) -> list[dict]:
    ds = datasets.load(name, **LOADS[name])
    gi, gs = ds.ground_truth("ip", k=K)
    n, d = ds.base.shape
    # a random split: held-out rows come sorted by row, and GloVe's rows are sorted by word
    # frequency, so the first 200 would be the most frequent words, easier than the rest
    perm = np.random.default_rng(0).permutation(len(ds.queries))
    sample = ds.queries[perm[:N_SAMPLE]]
    q, rest = np.ascontiguousarray(ds.queries[perm[N_SAMPLE:]]), perm[N_SAMPLE:]
    gt = (gi[rest], gs[rest])
    log(f"{name}: {n:,} x {d}, {len(q)} scored queries")
    rows, series, searches = [], {}, {}
    for label, build, values in methods(d, n):
        t = time.perf_counter()
        search = build(ds.base)
        took = time.perf_counter() - t
        mem = getattr(search, "memory", None)
        with thread_limit(1):
            sw = sweep(search, values, q, gt, ds.base)
        series[label] = [(r, s) for _, r, s in sw]
        searches[label] = search
        log(f"{name}: {label} built in {took:.1f} s; best recall {max(r for _, r, _ in sw):.4f}")
        for target in targets:
            ok = [p for p in sw if p[1] >= target]
            best = max(ok, key=lambda p: p[2]) if ok else None
            rows.append({"dataset": name, "target": target, "method": label,
                         "setting": "-" if best is None else str(best[0]),
                         "recall@10": None if best is None else best[1],
                         "q/s (1 thread)": None if best is None else best[2],
                         "build s": took,
                         "bytes/item": None if mem is None else mem() / n,
                         "_value": None if best is None else best[0]})
    for target in targets:
        t = time.perf_counter()
        auto = auto_index(ds.base, "ip", target_recall=target, k=K, queries=sample,
                          progress=False, sample_size=min(n, 20_000), confidence=confidence)
        took = time.perf_counter() - t
        with thread_limit(1):
            (_, rec, qps), = sweep(lambda qq, v, a=auto: a.search(qq, K).ids, [None], q, gt,
                                   ds.base)  # fmt: skip
        log(f"{name} @ {target}: auto chose {auto.chosen} in {took:.0f} s: recall {rec:.4f}")
        rows.append({"dataset": name, "target": target, "method": f"auto_index -> {auto.chosen}",
                     "setting": f"tuned on 200 given queries, confidence {confidence:g}",
                     "recall@10": rec,
                     "q/s (1 thread)": qps, "build s": took, "bytes/item": None,
                     "_series": series})
        print(f"\n### auto_index report, {name}, target {target}\n{auto.report}", flush=True)
        rows.append(alternated(name, target, rows, searches, auto, q))
    plot_recall_qps(series, img / f"peers-{name}.png",
                    f"{name} ({n:,} x {d}), inner product, one thread")
    return rows


def qps_at(series: list[tuple[float, float]], recall: float) -> float | None:
    """A method's q/s at this recall from its sweep's (recall, q/s) points: linear between the
    two frontier points around it (the frontier: each point faster than every point of higher
    recall); None if the sweep never reached it."""
    front, fastest = [], 0.0
    for r, s in sorted(series, reverse=True):
        if s > fastest:
            front.append((r, s))
            fastest = s
    front.reverse()  # by increasing recall, decreasing q/s
    above = [i for i, (r, _) in enumerate(front) if r >= recall]
    if not above:
        return None
    i = above[0]
    if i == 0:
        return front[0][1]
    (r1, s1), (r2, s2) = front[i - 1], front[i]
    return s1 + (s2 - s1) * (recall - r1) / (r2 - r1)


def alternated(name, target, rows, searches, auto, q) -> dict:
    """The fastest simsearch setting, the fastest peer's and auto_index timed again in turn
    (best of 5 rounds of at least 0.2 s each): sweeps minutes apart on a shared machine differ by
    up to 30%, so the ratios come from these."""
    rs = [r for r in rows if r["dataset"] == name and r["target"] == target
          and r.get("_value") is not None]
    ours = [r for r in rs if r["method"].startswith("simsearch")]
    peers = [r for r in rs if not r["method"].startswith(("simsearch", "auto_index"))]
    out = {"dataset": name, "target": target}
    if not ours or not peers:
        return out
    mine = max(ours, key=lambda r: r["q/s (1 thread)"])
    peer = max(peers, key=lambda r: r["q/s (1 thread)"])
    fns = [lambda r=r: searches[r["method"]](q, r["_value"]) for r in (mine, peer)]
    fns.append(lambda: auto.search(q, K))
    with thread_limit(1):
        t_mine, t_peer, t_auto = alternated_best_times(fns, rounds=5, min_seconds=0.2)
    log(f"{name} @ {target}: alternated {mine['method']} {len(q) / t_mine:,.0f}, "
        f"{peer['method']} {len(q) / t_peer:,.0f}, auto {len(q) / t_auto:,.0f} q/s")
    return {**out, "_alternated": True, "mine": mine["method"], "peer": peer["method"],
            "mine q/s": len(q) / t_mine, "peer q/s": len(q) / t_peer,
            "auto q/s": len(q) / t_auto}


def at_auto_recall(rows: list[dict], a: dict, auto: dict) -> float | None:
    """auto against the best simsearch method at auto's own held-out recall (above the target:
    the margin of its promise): the alternated ratio, times how much faster that method's row
    at the target ran than the method at auto's recall, both from its sweep."""
    row = next(r for r in rows if r["dataset"] == a["dataset"] and r["target"] == a["target"]
               and r.get("method") == a["mine"])
    there = qps_at(auto["_series"][a["mine"]], auto["recall@10"])
    if there is None:
        return None
    return a["auto q/s"] / a["mine q/s"] * row["q/s (1 thread)"] / there


def summary(rows: list[dict]) -> list[dict]:
    """Per dataset and target: the best simsearch method and auto against the best peer."""
    out = []
    for a in (r for r in rows if r.get("_alternated")):
        auto = next(r for r in rows if r["dataset"] == a["dataset"]
                    and r["target"] == a["target"] and r["method"].startswith("auto_index"))
        out.append({"dataset": a["dataset"], "target": a["target"],
                    "best simsearch": f"{a['mine']} {a['mine q/s']:,.0f}",
                    "best peer": f"{a['peer']} {a['peer q/s']:,.0f}",
                    "auto_index (held-out recall)":
                        f"{auto['method'][len('auto_index -> '):]} {a['auto q/s']:,.0f} "
                        f"({auto['recall@10']:.4f})",
                    "best simsearch / best peer": a["mine q/s"] / a["peer q/s"],
                    "auto / best peer": a["auto q/s"] / a["peer q/s"],
                    "auto / best simsearch": a["auto q/s"] / a["mine q/s"],
                    "auto / best simsearch at auto's recall": at_auto_recall(rows, a, auto)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=list(LOADS))
    ap.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95])
    ap.add_argument("--img", type=Path, default=Path("docs/img"))
    ap.add_argument("--auto-confidence", type=float, default=0.99,
                    help="auto_index's confidence (its promise's; docs/benchmarks.md)")
    a = ap.parse_args()
    rows = []
    for name in a.datasets:
        rows += run(name, a.targets, a.img, a.auto_confidence)
        print("\n" + markdown_table(
            [r for r in rows if r["dataset"] == name and "method" in r],
            ["dataset", "target", "method", "setting", "recall@10", "q/s (1 thread)", "build s",
             "bytes/item"]), flush=True)
    print("\n## Summary (the best of each side and auto_index re-timed in turn)\n\n"
          + markdown_table(summary(rows), [
              "dataset", "target", "best simsearch", "best peer", "auto_index (held-out recall)",
              "best simsearch / best peer", "auto / best peer", "auto / best simsearch",
              "auto / best simsearch at auto's recall"]))


if __name__ == "__main__":
    main()

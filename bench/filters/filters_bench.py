"""Filtered search: simsearch's planner against faiss (HNSW and IVF with an IDSelector),
hnswlib's filter and the exact scan of the allowed rows (numpy gather + matrix product).

Filters, per dataset: random allow lists at selectivities 50%, 10%, 1%, 0.1%; allow lists
correlated with the vectors' clusters (whole k-means clusters, mostly not the query's own) at
10% and 1%; per-query deny lists of 50-500 ids drawn from each query's own 1,000 nearest items
(a recommender's "already seen"). Recall@10 against the exact filtered answer, one thread.

For each method and filter the table gives its q/s at recall@10 0.9 and 0.95, read off the
curve its parameter grid traces (log-linear between the two settings around the target; "-":
never reached), and the best recall it reached.

    python bench/filters/filters_bench.py                      # both datasets (~15 min)
    python bench/filters/filters_bench.py --datasets longtail --queries 300   # quicker
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import markdown_table, thread_limit, value_at_recall

K = 10
TARGETS = (0.9, 0.95)
EFS = (10, 16, 24, 32, 48, 64, 128, 256)
OUT = Path(__file__).resolve().parents[1] / "results" / "filters"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# -- filters -------------------------------------------------------------------------------------


def make_filters(base: np.ndarray, queries: np.ndarray, seed: int = 0) -> dict[str, dict]:
    """name -> {"allow": shared ids} or {"deny": per-query lists}; "selectivity" for the table."""
    import faiss

    rng = np.random.default_rng(seed)
    n = base.shape[0]
    out = {}
    for s in (0.5, 0.1, 0.01, 0.001):
        out[f"random {s:.1%}"] = {"allow": np.flatnonzero(rng.random(n) < s), "selectivity": s}
    km = faiss.Kmeans(base.shape[1], 200, niter=10, seed=seed, spherical=True)
    km.train(base[rng.choice(n, min(n, 50_000), replace=False)])
    _, lab = km.index.search(base, 1)
    lab = lab.ravel()
    sizes = np.bincount(lab, minlength=200)
    for s in (0.1, 0.01):
        order, total, chosen = rng.permutation(200), 0, []
        for c in order:
            if total >= s * n:
                break
            chosen.append(c)
            total += sizes[c]
        allow = np.flatnonzero(np.isin(lab, chosen))
        out[f"clusters {s:.0%}"] = {"allow": allow, "selectivity": allow.size / n}
    f = ss.FlatIndex(base.shape[1], "ip")
    f.add(base)
    near = f.search(queries, 1000).ids
    deny = [rng.choice(row, rng.integers(50, 501), replace=False) for row in near]
    out["deny 50-500 own"] = {"deny": deny, "selectivity": 1 - np.mean([d.size for d in deny]) / n}
    return out


def truth(base, queries, flt) -> np.ndarray:
    f = ss.FlatIndex(base.shape[1], "ip")
    f.add(base)
    return f.search(queries, K, allow=flt.get("allow"), deny=flt.get("deny")).ids


def recall(ids: np.ndarray, gt: np.ndarray) -> float:
    hits = sum(len(set(a[a >= 0].tolist()) & set(b[b >= 0].tolist()))
               for a, b in zip(ids, gt, strict=True))
    return hits / max(1, int((gt >= 0).sum()))


# -- methods: each returns {setting: search(queries) -> ids} for one filter ---------------------


def ss_methods(indexes: dict, flt: dict) -> dict:
    kw = {k: flt[k] for k in ("allow", "deny") if k in flt}
    out = {}
    for key, label in (("ss-hnsw", "simsearch hnsw"), ("ss-ipnsw", "simsearch ipnsw-plus")):
        idx = indexes[key]
        for ef in EFS:
            out[(f"{label} (planner)", f"ef={ef}")] = \
                lambda q, ef=ef, idx=idx: idx.search(q, K, ef=ef, **kw).ids
    ivf = indexes["ss-norm-ivf"]
    for p in (2, 4, 8, 16, 32):
        out[("simsearch norm-ivf (planner)", f"n_probe={p}")] = \
            lambda q, p=p: ivf.search(q, K, n_probe=p, **kw).ids
    ns = indexes["ss-norm-scan"]
    out[("simsearch norm-scan (exact)", "-")] = lambda q: ns.search(q, K, **kw).ids
    return out


def faiss_methods(indexes: dict, flt: dict, n: int) -> dict:
    import faiss

    out = {}
    if "allow" in flt:
        bitmap = np.zeros(n, bool)
        bitmap[flt["allow"]] = True
        packed = np.packbits(bitmap, bitorder="little")
        sel = faiss.IDSelectorBitmap(n, faiss.swig_ptr(packed))
        sels = None
    else:
        sels = [faiss.IDSelectorNot(faiss.IDSelectorBatch(d.size, faiss.swig_ptr(
            np.ascontiguousarray(d, np.int64)))) for d in flt["deny"]]
        keep = sels  # noqa: F841  (the selectors must outlive the searches)

    def run(index, params_cls, **p):
        def go(q):
            if sels is None:
                return index.search(q, K, params=params_cls(sel=sel, **p))[1]
            out_ids = np.empty((q.shape[0], K), np.int64)
            for i in range(q.shape[0]):
                out_ids[i] = index.search(q[i : i + 1], K, params=params_cls(sel=sels[i], **p))[1]
            return out_ids
        go.keep = (sel if sels is None else sels, packed if sels is None else None)
        return go

    for ef in (*EFS, 512):
        out[("faiss HNSW + IDSelector", f"efSearch={ef}")] = run(
            indexes["faiss-hnsw"], faiss.SearchParametersHNSW, efSearch=ef)
    for p in (4, 8, 16, 32, 64):
        out[("faiss IVF + IDSelector", f"nprobe={p}")] = run(
            indexes["faiss-ivf"], faiss.SearchParametersIVF, nprobe=p)
    return out


def hnswlib_methods(indexes: dict, flt: dict, n: int) -> dict:
    h = indexes["hnswlib"]
    out = {}
    if "allow" in flt:
        ok = np.zeros(n, bool)
        ok[flt["allow"]] = True
        allowed = ok.tolist()
        fns = None
    else:
        fns = [frozenset(d.tolist()) for d in flt["deny"]]
    for ef in (16, 64, 256):
        def go(q, ef=ef):
            h.set_ef(ef)
            if fns is None:
                try:
                    return h.knn_query(q, K, num_threads=1, filter=allowed.__getitem__)[0]
                except RuntimeError:  # fewer than K found: hnswlib refuses the batch
                    return np.full((q.shape[0], K), -1)
            ids = np.full((q.shape[0], K), -1, np.int64)
            for i in range(q.shape[0]):
                d = fns[i]
                try:
                    ids[i] = h.knn_query(q[i : i + 1], K, num_threads=1,
                                         filter=lambda x, d=d: x not in d)[0]
                except RuntimeError:
                    pass
            return ids
        out[("hnswlib + filter", f"ef={ef}")] = go
    return out


def numpy_scan(base: np.ndarray, flt: dict) -> dict:
    """The exact scan of the allowed rows in plain numpy, 64 queries per matrix product."""
    def go(q):
        ids = np.empty((q.shape[0], K), np.int64)
        if "allow" in flt:
            a = flt["allow"]
            rows = base[a]
        for s0 in range(0, q.shape[0], 64):
            if "allow" in flt:
                s = q[s0 : s0 + 64] @ rows.T
            else:
                s = q[s0 : s0 + 64] @ base.T
                for j, d in enumerate(flt["deny"][s0 : s0 + 64]):
                    s[j, d] = -np.inf
            kk = min(K, s.shape[1] - 1)
            top = np.argpartition(-s, kk, axis=1)[:, :K]
            order = np.argsort(-np.take_along_axis(s, top, 1), axis=1)
            top = np.take_along_axis(top, order, 1)
            ids[s0 : s0 + 64] = a[top] if "allow" in flt else top
        return ids
    return {("numpy: gather allowed rows + scan", "exact"): go}


# -- the run -------------------------------------------------------------------------------------


def build(base: np.ndarray) -> dict:
    import faiss
    import hnswlib

    n, d = base.shape
    out = {}
    t = time.perf_counter()
    out["ss-hnsw"] = ss.HNSWIndex(d, "ip", M=16, ef_construction=100)
    out["ss-hnsw"].add(base)
    ivf = ss.NormIVFIndex(d, n_lists=int(np.sqrt(n)))
    ivf.train(base[:100_000])
    ivf.add(base)
    out["ss-norm-ivf"] = ivf
    ns = ss.NormScanIndex(d)
    ns.add(base)
    out["ss-norm-scan"] = ns
    ip = ss.create_index("ipnsw-plus", d, "ip", M=16, progress=False)
    ip.add(base)
    out["ss-ipnsw"] = ip
    log(f"simsearch indexes built in {time.perf_counter() - t:.0f} s")
    t = time.perf_counter()
    fh = faiss.IndexHNSWFlat(d, 16, faiss.METRIC_INNER_PRODUCT)
    fh.hnsw.efConstruction = 100
    fh.add(base)
    out["faiss-hnsw"] = fh
    quant = faiss.IndexFlatIP(d)
    fi = faiss.IndexIVFFlat(quant, d, int(np.sqrt(n)), faiss.METRIC_INNER_PRODUCT)
    fi.train(base[:100_000])
    fi.add(base)
    out["faiss-ivf"] = fi
    h = hnswlib.Index(space="ip", dim=d)
    h.init_index(n, M=16, ef_construction=100, random_seed=100)
    h.add_items(base, np.arange(n))
    out["hnswlib"] = h
    log(f"peer indexes built in {time.perf_counter() - t:.0f} s")
    return out


def run_dataset(name: str, base: np.ndarray, queries: np.ndarray, rows: list, curves: dict):
    n = base.shape[0]
    log(f"{name}: {n} x {base.shape[1]}, {len(queries)} queries")
    idx = build(base)
    filters = make_filters(base, queries)
    for fname, flt in filters.items():
        gt = truth(base, queries, flt)
        methods = {**ss_methods(idx, flt), **faiss_methods(idx, flt, n),
                   **hnswlib_methods(idx, flt, n), **numpy_scan(base, flt)}
        with thread_limit(1):
            for (method, _setting), fn in methods.items():
                if method.startswith("simsearch"):
                    fn(queries)  # warm up: numba compiles on first use
                t = time.perf_counter()
                ids = fn(queries)
                dt = time.perf_counter() - t
                curves.setdefault((name, fname), {}).setdefault(method, []).append(
                    (recall(ids, gt), len(queries) / dt))
        cur = curves[(name, fname)]
        scan = cur["numpy: gather allowed rows + scan"][0][1]
        for method, pts in cur.items():
            row = {"dataset": name, "filter": fname,
                   "selectivity": f"{filters[fname]['selectivity']:.2%}", "method": method,
                   "best recall": round(max(r for r, _ in pts), 3)}
            for t in TARGETS:
                v = value_at_recall(pts, t)
                row[f"q/s @{t}"] = "-" if v is None else v
                row[f"x scan @{t}"] = "-" if v is None else f"{v / scan:.2f}"
            rows.append(row)
        log(f"{name} / {fname}: " + ", ".join(
            f"{r['method'].split(' (')[0]} {r['q/s @0.9']}" for r in rows[-len(cur):]))


def plot(curves: dict, rows: list, path: Path) -> None:
    """q/s at recall 0.9 per filter, one line per method, one panel per dataset."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({r["dataset"] for r in rows})
    fig, axes = plt.subplots(1, len(datasets), figsize=(7 * len(datasets), 5), squeeze=False)
    for ax, ds in zip(axes[0], datasets, strict=True):
        sub = [r for r in rows if r["dataset"] == ds]
        filters = list(dict.fromkeys(r["filter"] for r in sub))
        for method in dict.fromkeys(r["method"] for r in sub):
            ys = [next((np.nan if r["q/s @0.9"] == "-" else r["q/s @0.9"])
                       for r in sub if r["filter"] == f and r["method"] == method)
                  for f in filters]
            ax.plot(range(len(filters)), ys, marker="o", label=method)
        ax.set_xticks(range(len(filters)), filters, rotation=30, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.set_ylabel("q/s at recall@10 0.9 (1 thread; gap: never reached)")
        ax.set_title(ds)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


SUMMARY = ("faiss HNSW + IDSelector", "faiss IVF + IDSelector", "hnswlib + filter",
           "numpy: gather allowed rows + scan")


def summary(rows: list) -> str:
    """One line per (dataset, filter): q/s at recall 0.9 of the best simsearch index (named),
    of simsearch's hnsw, and of each peer; "-": never reached 0.9."""
    out = []
    for key in dict.fromkeys((r["dataset"], r["filter"]) for r in rows):
        sub = {r["method"]: r for r in rows if (r["dataset"], r["filter"]) == key}
        ours = {m: r["q/s @0.9"] for m, r in sub.items()
                if m.startswith("simsearch") and r["q/s @0.9"] != "-"}
        best = max(ours, key=ours.get)
        line = {"dataset": key[0], "filter": key[1], "selectivity": sub[best]["selectivity"],
                "best simsearch (index)": f"{ours[best]:,.0f} ({best[10:].split(' (')[0]})",
                "simsearch hnsw": sub["simsearch hnsw (planner)"]["q/s @0.9"]}
        for m in SUMMARY:
            line[m] = sub[m]["q/s @0.9"]
        out.append(line)
    return markdown_table(out, list(out[0]))


def report(out: Path, rows: list, curves: dict) -> str:
    """Write table.md (every method), summary.md and filters.png; return the summary."""
    table = markdown_table(rows, ["dataset", "filter", "selectivity", "method", "q/s @0.9",
                                  "x scan @0.9", "q/s @0.95", "x scan @0.95", "best recall"])
    (out / "table.md").write_text(table + "\n")
    short = summary(rows)
    (out / "summary.md").write_text(short + "\n")
    plot(curves, rows, out / "filters.png")
    return short


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["longtail", "glove"])
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--report", action="store_true",
                    help="redraw the tables and the plot from OUT/results.json")
    args = ap.parse_args(argv)
    if args.report:
        doc = json.loads((args.out / "results.json").read_text())
        print(report(args.out, doc["rows"], doc["curves"]))
        return
    rows: list = []
    curves: dict = {}
    for ds in args.datasets:
        if ds == "longtail":
            d = load("synthetic-longtail", n=200_000, dim=64, n_queries=args.queries, seed=0)
            run_dataset("synthetic-longtail 200k x 64", d.base, d.queries, rows, curves)
        elif ds == "glove":
            d = load("glove-50", n_queries=args.queries)
            run_dataset(f"glove-50 ip {d.base.shape[0] // 1000}k", d.base, d.queries, rows,
                        curves)
        else:
            ap.error(f"unknown dataset {ds!r}: longtail or glove")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(
        {"rows": rows, "curves": {f"{a} | {b}": v for (a, b), v in curves.items()}},
        default=float, indent=1))
    print(report(args.out, rows, curves))


if __name__ == "__main__":
    main()

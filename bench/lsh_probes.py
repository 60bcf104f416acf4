"""Recall@10/@20 against probed items T and against queries/s for Simple-LSH and Norm-Ranging LSH
(every bucket ranking), beside exact search, faiss IndexLSH + exact re-rank, the norm-scan floor and
hnswlib "ip", all in one process and one run (one search thread).

    python -m bench.lsh_probes --dataset glove-50 --n-queries 200
    python -m bench.lsh_probes --dataset synthetic-longtail --n 1000000 --n-queries 200

Writes bench/results/lsh-<dataset>/results.json, results.md and PNGs.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from simsearch import datasets
from simsearch.eval import markdown_table, recall_at_k, thread_limit

from .adapters import FaissFlat, HnswlibRaw, NormScan
from .adapters_lsh import FaissLSHRerank, LSHAdapter

log = logging.getLogger("bench.lsh_probes")
TS = [30, 100, 300, 1000, 3000, 10000, 30000, 100000, 300000]


def timed(fn, q, repeats=2):
    best = np.inf
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn(q)
        best = min(best, time.perf_counter() - t)
    return out, len(q) / best


def at_recall(points, target=0.9, key=0):
    """Interpolate (recall, value) points (value: T or qps, log-linear) at recall = target."""
    pts = sorted(points)
    for (r0, v0), (r1, v1) in zip(pts, pts[1:], strict=False):
        if r0 <= target <= r1 and r1 > r0:
            f = (target - r0) / (r1 - r0)
            return float(np.exp(np.log(v0) + f * (np.log(v1) - np.log(v0))))
    return None


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="synthetic-longtail")
    p.add_argument("--n", type=int, default=100_000, help="synthetic-longtail size")
    p.add_argument("--n-queries", type=int, default=200)
    p.add_argument("--bits", default="16,32,64")
    p.add_argument("--rankings", default="threshold,ucb,shifted,plain")
    p.add_argument("--max-t", type=int, default=300_000)
    p.add_argument("--hnsw", default="16,100", help="M,ef_construction ('' to skip)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")

    if a.dataset == "synthetic-longtail":
        ds = datasets.load(a.dataset, n=a.n, dim=64, n_queries=a.n_queries, seed=0)
    elif a.dataset == "glove-50":
        ds = datasets.load(a.dataset, n_queries=a.n_queries)
    else:
        ds = datasets.load(a.dataset)
    base, q = ds.base, ds.queries
    n = len(base)
    gi, gs = ds.ground_truth("ip", 100)
    out = Path(a.out or Path(__file__).parent / "results" / f"lsh-{a.dataset}")
    out.mkdir(parents=True, exist_ok=True)
    Ts = [t for t in TS if t <= min(a.max_t, n)] + ([n] if n <= a.max_t else [])

    def rec(ids, k):
        return recall_at_k(ids, gi, k, gt_scores=gs, queries=q, base=base, metric="ip")

    runs = []

    def record(method, bits, param, ids20, qps, work):
        runs.append({"method": method, "bits": bits, "param": param, "recall10": rec(ids20, 10),
                     "recall20": rec(ids20, 20), "qps": qps, "probed": work})  # fmt: skip
        log.info("%s bits=%s %s: r10=%.3f qps=%.0f work=%.0f", method, bits, param,
                 runs[-1]["recall10"], qps, work or 0)  # fmt: skip

    with thread_limit(1):
        ex = FaissFlat("ip")
        ex.fit(base)
        ids, qps = timed(lambda x: ex.query(x, 20), q)
        record("exact (faiss flat)", None, None, ids, qps, float(n))
        ns = NormScan("ip")
        ns.fit(base)
        for T in Ts:
            ids, qps = timed(lambda x, T=T: ns.query(x, 20, n_items=T), q)
            record("norm-scan floor", None, T, ids, qps, float(min(T, n)))
        for bits in [int(b) for b in a.bits.split(",")]:
            variants = [("simple-lsh", "simple-lsh", {}, [None])]
            variants.append(("nr-lsh", "nr-lsh", {"n_ranges": 32}, a.rankings.split(",")))
            for label, kind, bp, rankings in variants:
                ad = LSHAdapter(kind, "ip", n_bits=bits, **bp)
                t = time.perf_counter()
                ad.fit(base)
                log.info("built %s %d bits in %.1f s", kind, bits, time.perf_counter() - t)
                for rk in rankings:
                    for T in Ts:
                        kw = {"n_probe_items": T} | ({"ranking": rk} if rk else {})
                        ids, qps = timed(lambda x, kw=kw, ad=ad: ad.query(x, 20, **kw), q)
                        name = label if rk is None else f"{label} ({rk})"
                        record(name, bits, T, ids, qps, ad.work()["probed_items"])
            fl = FaissLSHRerank("ip", n_bits=bits)
            fl.fit(base)
            for T in [t for t in Ts if t <= 30000]:
                ids, qps = timed(lambda x, T=T, fl=fl: fl.query(x, 20, n_probe_items=T), q)
                record("faiss IndexLSH + re-rank", bits, T, ids, qps, float(T))
        if a.hnsw:
            M, efc = (int(v) for v in a.hnsw.split(","))
            hn = HnswlibRaw("ip", M=M, ef_construction=efc, n_threads=2)
            t = time.perf_counter()
            with thread_limit(2):
                hn.fit(base)
            log.info("built hnswlib in %.1f s", time.perf_counter() - t)
            for ef in (20, 40, 80, 160, 320, 640):
                ids, qps = timed(lambda x, ef=ef: hn.query(x, 20, ef=ef), q)
                record("hnswlib ip", None, ef, ids, qps, None)

    doc = {"dataset": a.dataset, "n": n, "dim": base.shape[1], "n_queries": len(q),
           "args": vars(a), "runs": runs}  # fmt: skip
    (out / "results.json").write_text(json.dumps(doc, indent=1))
    report(out)


def report(out: Path) -> None:
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    groups: dict[tuple, list] = {}
    for r in runs:
        groups.setdefault((r["method"], r["bits"]), []).append(r)
    rows = []
    for (m, b), rs in groups.items():
        t90 = at_recall([(r["recall10"], r["probed"]) for r in rs if r["probed"]])
        q90 = at_recall([(r["recall10"], r["qps"]) for r in rs])
        best = max(r["recall10"] for r in rs)
        rows.append({"method": m, "bits": b if b else "-", "probed items @ r10=0.9": t90 or "",
                     "QPS @ r10=0.9": q90 or "", "best recall@10": best})  # fmt: skip
    lines = [f"# LSH: {doc['dataset']} n={doc['n']:,} d={doc['dim']}, {doc['n_queries']} queries,"
             " inner product, 1 thread", "", markdown_table(rows, list(rows[0])), "",
             "## all settings", "",
             markdown_table([{**r, "bits": r["bits"] or "-"} for r in runs],
                            ["method", "bits", "param", "recall10", "recall20", "probed", "qps"]),
             ""]  # fmt: skip
    (out / "results.md").write_text("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 5))
    for (m, b), rs in groups.items():
        if b not in (None, 32):
            continue
        lab = m if b is None else f"{m} {b}b"
        rs = sorted(rs, key=lambda r: r["recall10"])
        if rs[0]["probed"] is not None and m != "exact (faiss flat)":
            pr = sorted(rs, key=lambda r: r["probed"])
            axes[0].plot([r["probed"] for r in pr], [r["recall10"] for r in pr], "o-", ms=3,
                         label=lab)  # fmt: skip
        qs = sorted(rs, key=lambda r: r["recall10"])
        axes[1].plot([r["recall10"] for r in qs], [r["qps"] for r in qs], "o-", ms=3, label=lab)
    axes[0].set_xscale("log")
    axes[0].set_xlabel("probed items T (log)")
    axes[0].set_ylabel("recall@10")
    axes[1].set_yscale("log")
    axes[1].set_xlabel("recall@10")
    axes[1].set_ylabel("queries/s, 1 thread (log)")
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"{doc['dataset']} n={doc['n']:,}: 32-bit codes")
    fig.tight_layout()
    fig.savefig(out / f"lsh-{doc['dataset']}.png", dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    main()

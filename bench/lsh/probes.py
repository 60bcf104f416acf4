"""Recall@10/@20 against probed items T and against queries/s for Simple-LSH and Norm-Ranging LSH
(both bucket rankings), beside exact search, hnswlib "ip", faiss IndexLSH + exact re-rank and the
norm-scan floor, all in one process (search single-threaded; hnswlib built with 2 threads).

    python -m bench.lsh.probes --dataset ml100k-svd
    python -m bench.lsh.probes --dataset glove-50 --n-queries 200
    python -m bench.lsh.probes --dataset synthetic-longtail --n 1000000 --n-queries 200

Results go to bench/results/lsh-<dataset>/results.json, rewritten after every measured setting, so
a killed run keeps what it measured. Each method (a build plus its T sweep) is a group; rerunning
the same command skips the groups already finished (``--fresh`` starts over, ``--redo hnswlib``
measures the named groups again). A method's T sweep stops once recall@10 >= ``--stop-recall``.
``--report-only`` redraws tables and plots from the JSON; ``--img DIR`` also writes the two PNGs
there (docs/img for the docs).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import time
from pathlib import Path

from simsearch import datasets
from simsearch.eval import (
    markdown_table,
    plot_recall_qps,
    recall_at_k,
    thread_limit,
    timed,
    value_at_recall,
)

from ..adapters import FaissFlat, HnswlibRaw, NormScan
from ..adapters_lsh import FaissLSHRerank, LSHAdapter

log = logging.getLogger("bench.lsh.probes")
TS = [30, 100, 300, 1000, 2000, 3000, 5000, 10_000, 20_000, 30_000, 50_000, 100_000, 200_000,
      300_000, 500_000]  # fmt: skip
EFS = [10, 20, 40, 80, 160, 320, 640, 1280, 2560]


def timed_qps(fn, q, repeats=2, once_above=2.0):
    """(output, queries/s of the best of ``repeats`` calls; one call when it took longer than
    ``once_above`` seconds)."""
    out, seconds = timed(lambda: fn(q), repeats, once_above=once_above)
    return out, len(q) / seconds


def at_recall(points, target=0.9):
    """Log-linear read of (recall, value) points at ``target`` (``simsearch.eval``)."""
    return value_at_recall(points, target)


class Store:
    """results.json written after every record; finished groups survive a restart."""

    def __init__(self, path: Path, header: dict, fresh: bool, redo: list[str]):
        self.path = path
        self.doc = {**header, "runs": [], "done": [], "loads": {}}
        self.process = time.strftime("%Y-%m-%d %H:%M:%S")  # which invocation measured a group
        if path.exists() and not fresh:
            old = json.loads(path.read_text())
            same = all(old.get(key) == header[key] for key in ("dataset", "n", "n_queries"))
            if same:
                done = set(old.get("done", [])) - set(redo)
                self.doc["runs"] = [r for r in old["runs"] if r["group"] in done]
                self.doc["done"] = sorted(done)
                self.doc["loads"] = old.get("loads", {})
                log.info("resuming: %d finished groups kept", len(done))

    def done(self, group: str) -> bool:
        return group in self.doc["done"]

    def start(self, group: str) -> None:
        self.doc["loads"][group] = [round(v, 2) for v in os.getloadavg()] + [self.process]

    def record(self, row: dict) -> None:
        self.doc["runs"].append(row)
        self._write()

    def finish(self, group: str) -> None:
        self.doc["done"].append(group)
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1))
        tmp.replace(self.path)


def load_dataset(a) -> datasets.Dataset:
    """The dataset named by the LSH scripts' --dataset / --n / --n-queries options."""
    if a.dataset == "synthetic-longtail":
        return datasets.load(a.dataset, n=a.n, dim=64, n_queries=a.n_queries, seed=0)
    if a.dataset == "glove-50":
        return datasets.load(a.dataset, n_queries=a.n_queries)
    return datasets.load(a.dataset)


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="synthetic-longtail")
    p.add_argument("--n", type=int, default=100_000, help="synthetic-longtail size")
    p.add_argument("--n-queries", type=int, default=200)
    p.add_argument("--bits", default="16,32,64")
    p.add_argument("--rankings", default="shifted,plain")
    p.add_argument("--max-t", type=int, default=None, help="largest T (default: the base size)")
    p.add_argument("--faiss-max-t", type=int, default=30_000)
    p.add_argument("--stop-recall", type=float, default=0.995)
    p.add_argument("--hnsw", default="16,100", help="M,ef_construction ('' to skip)")
    p.add_argument("--out", default=None)
    p.add_argument("--img", default=None, help="also write the PNGs here (e.g. docs/img)")
    p.add_argument("--fresh", action="store_true")
    p.add_argument("--redo", default="", help="groups to measure again, e.g. hnswlib,exact")
    p.add_argument("--report-only", action="store_true")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(a.out or Path(__file__).resolve().parents[1] / "results" / f"lsh-{a.dataset}")
    if a.report_only:
        report(out, a.img)
        return

    ds = load_dataset(a)
    base, q = ds.base, ds.queries
    n = len(base)
    gi, gs = ds.ground_truth("ip", 100)
    out.mkdir(parents=True, exist_ok=True)
    max_t = min(a.max_t or n, n)
    Ts = sorted({t for t in TS if t < max_t} | {max_t})
    header = {"dataset": a.dataset, "n": n, "dim": int(base.shape[1]), "n_queries": len(q),
              "args": vars(a)}  # fmt: skip
    store = Store(out / "results.json", header, a.fresh, a.redo.split(",") if a.redo else [])

    def rec(ids, k):
        return recall_at_k(ids, gi, k, gt_scores=gs, queries=q, base=base, metric="ip")

    def sweep(group, method, bits, params, run):
        """Measure run(param) -> (ids, qps, work) over params until recall@10 >= stop."""
        for param in params:
            ids, qps, work = run(param)
            row = {"group": group, "method": method, "bits": bits, "param": param,
                   "recall10": rec(ids, 10), "recall20": rec(ids, 20), "qps": qps,
                   "probed": work}  # fmt: skip
            store.record(row)
            log.info("%s bits=%s %s: r10=%.3f r20=%.3f qps=%.0f probed=%.0f", method, bits,
                     param, row["recall10"], row["recall20"], qps, work or 0)  # fmt: skip
            if row["recall10"] >= a.stop_recall:
                break
        store.finish(group)

    with thread_limit(1):
        if not store.done("exact"):
            store.start("exact")
            ex = FaissFlat("ip")
            ex.fit(base)
            sweep("exact", "exact (faiss flat)", None, [None],
                  lambda _: (*timed_qps(lambda x: ex.query(x, 20), q), float(n)))  # fmt: skip
        if a.hnsw and not store.done("hnswlib"):
            store.start("hnswlib")
            M, efc = (int(v) for v in a.hnsw.split(","))
            hn = HnswlibRaw("ip", M=M, ef_construction=efc, n_threads=2)
            t = time.perf_counter()
            with thread_limit(2):
                hn.fit(base)
            log.info("built hnswlib M=%d efc=%d in %.1f s", M, efc, time.perf_counter() - t)
            sweep("hnswlib", f"hnswlib ip (M={M})", None, EFS,
                  lambda ef: (*timed_qps(lambda x: hn.query(x, 20, ef=ef), q), None))  # fmt: skip
            del hn
        if not store.done("norm-scan"):
            store.start("norm-scan")
            ns = NormScan("ip")
            ns.fit(base)

            def run_scan(T):
                return (*timed_qps(lambda x: ns.query(x, 20, n_items=T), q), float(T))

            sweep("norm-scan", "norm-scan floor", None, Ts, run_scan)
        for bits in [int(b) for b in a.bits.split(",")]:
            groups = [(f"simple-lsh/{bits}", "simple-lsh", {}, None)]
            groups += [(f"nr-lsh/{bits}/{rk}", "nr-lsh", {"n_ranges": 32}, rk)
                       for rk in a.rankings.split(",")]  # fmt: skip
            built: dict = {}
            for group, kind, bp, rk in groups:
                if store.done(group):
                    continue
                store.start(group)
                if kind not in built:
                    ad = LSHAdapter(kind, "ip", n_bits=bits, **bp)
                    t = time.perf_counter()
                    ad.fit(base)
                    log.info("built %s %d bits in %.1f s", kind, bits, time.perf_counter() - t)
                    built = {kind: ad}
                ad = built[kind]
                extra = {"ranking": rk} if rk else {}

                def run(T, ad=ad, extra=extra):
                    ids, qps = timed_qps(lambda x: ad.query(x, 20, n_probe_items=T, **extra), q)
                    return ids, qps, ad.work()["probed_items"]

                sweep(group, kind if rk is None else f"nr-lsh ({rk})", bits, Ts, run)
            group = f"faiss-lsh/{bits}"
            if not store.done(group):
                store.start(group)
                fl = FaissLSHRerank("ip", n_bits=bits)
                fl.fit(base)

                def run_faiss(T, fl=fl):
                    ids, qps = timed_qps(lambda x: fl.query(x, 20, n_probe_items=T), q)
                    return ids, qps, float(min(T, n))

                sweep(group, "faiss IndexLSH + re-rank", bits,
                      [t for t in Ts if t <= a.faiss_max_t], run_faiss)  # fmt: skip
    report(out, a.img)


def _label(method, bits):
    return method if bits is None else f"{method} {bits}b"


def report(out: Path, img: str | None = None) -> None:
    """results.md (summary, recall vs T at each code length, every setting) and two PNGs."""
    doc = json.loads((out / "results.json").read_text())
    runs = doc["runs"]
    order = ["exact", "hnswlib", "norm-scan", "simple-lsh", "nr-lsh (shifted)", "nr-lsh (plain)"]

    def rank(key):  # rows by code length, then in the order above
        return (key[1] or 0, next((i for i, o in enumerate(order) if key[0].startswith(o)), 9))

    groups: dict[tuple, list] = {}
    for r in sorted(runs, key=lambda r: rank((r["method"], r["bits"]))):
        groups.setdefault((r["method"], r["bits"]), []).append(r)
    summary = []
    for (m, b), rs in groups.items():
        summary.append({
            "method": m, "bits": b or "-",
            "T @ r10=0.9": at_recall([(r["recall10"], r["probed"]) for r in rs if r["probed"]]),
            "QPS @ r10=0.9": at_recall([(r["recall10"], r["qps"]) for r in rs]),
            "T @ r20=0.9": at_recall([(r["recall20"], r["probed"]) for r in rs if r["probed"]]),
            "best r10": max(r["recall10"] for r in rs),
            "QPS at best": max(rs, key=lambda r: r["recall10"])["qps"],
        })  # fmt: skip
    for row, rs in zip(summary, groups.values(), strict=True):
        for c in ("T @ r10=0.9", "QPS @ r10=0.9", "T @ r20=0.9"):
            uncounted = c.startswith("T") and rs[0]["probed"] is None  # hnswlib: no counter
            row[c] = "-" if uncounted else "not reached" if row[c] is None else row[c]
    ratios = []
    by = {(s["method"], s["bits"]): s for s in summary}
    for b in sorted({r["bits"] for r in runs if r["bits"]}):
        s, nr = by.get(("simple-lsh", b)), by.get(("nr-lsh (shifted)", b))
        if s and nr:
            f = [s[c] / nr[c] if isinstance(s[c], float) and isinstance(nr[c], float) else ""
                 for c in ("T @ r10=0.9", "QPS @ r10=0.9")]  # fmt: skip
            ratios.append({"bits": b, "probes Simple / NR": f[0],
                           "QPS NR / Simple": 1 / f[1] if f[1] else ""})  # fmt: skip
    loads = doc.get("loads", {})
    la = [v[0] for v in loads.values()]
    procs = sorted({v[3] for v in loads.values() if len(v) > 3})
    who = "; ".join(f"{t}: " + ", ".join(g for g, v in loads.items() if v[3:] == [t])
                    for t in procs)  # fmt: skip
    lines = [
        f"# LSH: {doc['dataset']} n={doc['n']:,} d={doc['dim']}, {doc['n_queries']} queries, "
        f"inner product, search on 1 thread",
        "",
        f"1-min load average at the start of each method: {min(la, default=0):.1f} to "
        f"{max(la, default=0):.1f} (2 cores). Processes: " + who,
        "",
        markdown_table(summary, list(summary[0])),
        "",
        markdown_table(ratios, ["bits", "probes Simple / NR", "QPS NR / Simple"]) if ratios else "",
        "",
    ]
    for b in sorted({r["bits"] for r in runs if r["bits"]}):
        cols = [(m, bb) for (m, bb) in groups if bb == b] + [("norm-scan floor", None)]
        cols = [c for c in cols if c in groups]
        Ts = sorted({r["param"] for c in cols for r in groups[c]})
        rows = []
        for T in Ts:
            row = {"T": T}
            for c in cols:
                hit = [r for r in groups[c] if r["param"] == T]
                row[_label(*c)] = (f"{hit[0]['recall10']:.3f} / {hit[0]['recall20']:.3f}"
                                   if hit else "")  # fmt: skip
            rows.append(row)
        lines += [f"## recall@10 / recall@20 against probed items T, {b} bits", "",
                  markdown_table(rows, ["T"] + [_label(*c) for c in cols]), ""]  # fmt: skip
    lines += ["## every setting", "",
              markdown_table([{**r, "bits": r["bits"] or "-"} for r in runs],
                             ["method", "bits", "param", "recall10", "recall20", "probed", "qps"]),
              ""]  # fmt: skip
    (out / "results.md").write_text("\n".join(lines))
    for d in [out] + ([Path(img)] if img else []):
        d.mkdir(parents=True, exist_ok=True)
        _plots(doc, groups, d)


def _plots(doc, groups, d: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    name = f"{doc['dataset']} n={doc['n']:,}"
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    for (m, b), rs in groups.items():
        if b not in (None, 32) or rs[0]["probed"] is None or m.startswith("exact"):
            continue
        pr = sorted(rs, key=lambda r: r["probed"])
        ax.plot([r["probed"] for r in pr], [r["recall10"] for r in pr], "o-", ms=3,
                label=_label(m, b))  # fmt: skip
    ax.axhline(0.9, color="grey", lw=0.6, ls="--")
    ax.set_xscale("log")
    ax.set_xlabel("probed items T (exact inner products per query, log)")
    ax.set_ylabel("recall@10")
    ax.set_title(f"{name}: recall vs probed items, 32-bit codes", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(d / f"lsh-{doc['dataset']}-probes.png", dpi=80)
    plt.close(fig)
    series = {_label(m, b): [(r["recall10"], r["qps"]) for r in rs]
              for (m, b), rs in groups.items() if b in (None, 32)}  # fmt: skip
    plot_recall_qps(series, d / f"lsh-{doc['dataset']}-qps.png",
                    f"{name}: recall vs queries/s (1 thread), 32-bit codes")  # fmt: skip
    from PIL import Image  # matplotlib's own dependency; a 256-colour palette keeps PNGs small

    for f in (f"lsh-{doc['dataset']}-probes.png", f"lsh-{doc['dataset']}-qps.png"):
        im = Image.open(d / f).convert("RGB").quantize(256)
        im.save(d / f, optimize=True)


if __name__ == "__main__":
    main()

"""Before/after of the LSH probe kernel, at recall@10 = 0.9, in one process: the kernel of a git
commit (``--before``, loaded from ``git show``) against the working tree's, on the same index
arrays, for Simple-LSH and NR-LSH at each code length; NR-LSH also with and without the norm
bound (``prune``). Beside them exact search (simsearch FlatIndex and faiss flat) and, with
``--hnsw``, hnswlib "ip".

For each method a T grid is swept with the current kernel until recall@10 >= 0.9; the two
settings bracketing 0.9 are then timed round-robin (``--rounds``), best time per setting, and QPS
at 0.9 is log-interpolated (as bench/lsh/probes.py does). Times are CPU seconds of this process
(``time.process_time``; search is single-threaded) so that other jobs on the shared machine
preempting it do not count; wall-clock QPS is written too.

    python -m bench.diagnostics.lsh_ab --dataset glove-50 --n-queries 200 --before 29bd3cb
    python -m bench.diagnostics.lsh_ab --dataset synthetic-longtail --n 1000000 --n-queries 200 \\
        --before 29bd3cb

Writes bench/results/lsh-<dataset>/ab.json and ab.md. ``--plot DIR`` draws DIR/lsh-ab-qps.png
from every ab.json present (QPS at recall 0.9, before/after, per dataset and code length).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.eval import markdown_table, recall_at_k, thread_limit
from simsearch.lsh import NormRangingLSH, SimpleLSH, pair_order
from simsearch.lsh import _kernels as K

from ..adapters import FaissFlat, HnswlibRaw
from ..lsh.probes import at_recall, load_dataset

log = logging.getLogger("bench.diagnostics.lsh_ab")
GRID = [300, 1000, 2000, 3000, 5000, 7000, 10_000, 15_000, 20_000, 30_000, 50_000, 70_000,
        100_000, 150_000, 200_000, 300_000, 500_000, 700_000, 1_000_000]  # fmt: skip
EFS = [10, 20, 40, 80, 160, 320, 640, 1280]


def old_kernels(commit: str):
    """The _kernels module of a commit, imported from a temporary file."""
    root = Path(__file__).resolve().parents[2]
    src = subprocess.run(["git", "show", f"{commit}:src/simsearch/lsh/_kernels.py"], cwd=root,
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    src = src.replace("from .._numba_util", "from simsearch._numba_util")
    d = Path(tempfile.mkdtemp())
    (d / f"lsh_kernels_{commit}.py").write_text(src)
    spec = importlib.util.spec_from_file_location(f"lsh_kernels_{commit}",
                                                  d / f"lsh_kernels_{commit}.py")  # fmt: skip
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="glove-50")
    p.add_argument("--n", type=int, default=100_000)
    p.add_argument("--n-queries", type=int, default=200)
    p.add_argument("--bits", default="16,32,64")
    p.add_argument("--before", default="29bd3cb", help="commit whose kernel is 'before'")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hnsw", default="", help="M,ef_construction of an hnswlib peer ('' skips)")
    p.add_argument("--plot", default=None, help="only draw the PNG into this directory")
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    if a.plot:
        plot(Path(a.plot))
        return
    out = Path(__file__).resolve().parents[1] / "results" / f"lsh-{a.dataset}"
    out.mkdir(parents=True, exist_ok=True)
    OK = old_kernels(a.before)
    ds = load_dataset(a)
    base, q = ds.base, ds.queries
    gi, gs = ds.ground_truth("ip", 100)
    n, d = base.shape

    def rec(ids):
        return float(recall_at_k(ids, gi, 10, gt_scores=gs, queries=q, base=base, metric="ip"))

    peers = {}  # label -> list of (param, recall, call)
    probes = {}  # label -> [(recall, probed items per query)]
    with thread_limit(1):
        for b in (int(v) for v in a.bits.split(",")):
            for cls, name in ((SimpleLSH, "simple-lsh"), (NormRangingLSH, "nr-lsh")):
                t0 = time.perf_counter()
                idx = cls(d, n_bits=b) if cls is SimpleLSH else cls(d, n_bits=b, n_ranges=32)
                idx.add(base)
                log.info("built %s/%d in %.1f s", name, b, time.perf_counter() - t0)
                st = idx._state
                pr, ph = pair_order(st.U, idx.n_hash_bits, "shifted")
                seq = pr.astype(np.int64) * (idx.n_hash_bits + 1) + ph
                old_args = (idx._projT, st.x, st.ids, st.bcode, st.bstart, st.rbstart, seq)
                variants = [(f"{name} {b}b: before", False, "old")]
                if cls is NormRangingLSH:
                    variants += [(f"{name} {b}b: after, no bound", False, "new")]
                variants += [(f"{name} {b}b: after", True, "new")]
                for label, prune, ker in variants:
                    new_args = idx._probe_args("shifted", prune)
                    rows, pts = [], []
                    for T in [t for t in GRID if t < n] + [n]:
                        if ker == "old":

                            def call(T=T, args=old_args):
                                return OK.search_batch(q, *args, T, 10)
                        else:

                            def call(T=T, args=new_args):
                                return K.search_batch(q, *args, T, 10)

                        ids, _, pro, _ = call()
                        r = rec(ids)
                        rows.append((T, r, call))
                        pts.append((r, float(pro.mean())))
                        if r >= 0.9:
                            break
                    peers[label] = rows
                    probes[label] = pts
                    log.info("%s: %s", label, [(T, round(r, 3)) for T, r, _ in rows])
        exact = ss.FlatIndex(d, "ip")
        exact.add(base)
        peers["exact (simsearch FlatIndex)"] = [(None, 1.0, lambda: exact.search(q, 10))]
        ff = FaissFlat("ip")
        ff.fit(base)
        peers["exact (faiss flat)"] = [(None, 1.0, lambda: ff.query(q, 10))]
        if a.hnsw:
            M, efc = (int(v) for v in a.hnsw.split(","))
            h = HnswlibRaw("ip", M=M, ef_construction=efc, n_threads=2)
            t0 = time.perf_counter()
            with thread_limit(2):
                h.fit(base)
            log.info("built hnswlib in %.1f s", time.perf_counter() - t0)
            rows = []
            for ef in EFS:
                r = rec(h.query(q, 10, ef=ef))
                rows.append((ef, r, lambda ef=ef: h.query(q, 10, ef=ef)))
                if r >= 0.9:
                    break
            peers[f"hnswlib ip (M={M})"] = rows
        # the two settings bracketing 0.9 of every method, timed round-robin
        timed = []
        for label, rows in peers.items():
            lo = [x for x in rows if x[1] < 0.9]
            hi = [x for x in rows if x[1] >= 0.9]
            timed += [(label, x) for x in ([lo[-1]] if lo else []) + hi[:1]]
        cpu = {i: np.inf for i in range(len(timed))}
        wall = dict(cpu)
        loads = []
        for rnd in range(a.rounds):
            loads.append(os.getloadavg()[0])
            for i, (_, (_, _, call)) in enumerate(timed):
                t, c = time.perf_counter(), time.process_time()
                call()
                cpu[i] = min(cpu[i], time.process_time() - c)
                wall[i] = min(wall[i], time.perf_counter() - t)
            log.info("round %d done (load %.1f)", rnd + 1, loads[-1])
    res = []
    for label in peers:
        idx_ = [i for i, (lab, _) in enumerate(timed) if lab == label]
        qc = at_recall([(timed[i][1][1], len(q) / cpu[i]) for i in idx_])
        qw = at_recall([(timed[i][1][1], len(q) / wall[i]) for i in idx_])
        tp = at_recall(probes[label]) if label in probes else None
        res.append({
            "method": label,
            "settings (param: recall@10)": ", ".join(
                f"{timed[i][1][0]}: {timed[i][1][1]:.3f}" for i in idx_),
            "probed items @ r10=0.9": tp if tp is not None else "-",
            "QPS @ r10=0.9 (CPU time)": qc,
            "QPS @ r10=0.9 (wall)": qw,
        })  # fmt: skip
    doc = {"dataset": a.dataset, "n": n, "n_queries": len(q), "before": a.before,
           "rounds": a.rounds, "loads": loads, "rows": res}  # fmt: skip
    (out / "ab.json").write_text(json.dumps(doc, indent=1, default=str))
    md = (
        f"{a.dataset} n={n:,} d={d}, {len(q)} queries; kernel before = {a.before}; "
        f"{a.rounds} rounds round-robin, best time per setting, 1 thread; 1-min load "
        f"{min(loads):.1f} to {max(loads):.1f}.\n\n" + markdown_table(res, list(res[0]))
    )
    (out / "ab.md").write_text(md + "\n")
    print(md)


def plot(img: Path) -> None:
    """Grouped bars: CPU-time QPS at recall@10 = 0.9 per code length, before/after, log scale."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    docs = [json.loads(f.read_text()) for f in sorted(Path(__file__).resolve().parents[1].glob(
        "results/lsh-*/ab.json"))]  # fmt: skip
    fig, axes = plt.subplots(1, len(docs), figsize=(5.5 * len(docs), 4), squeeze=False)
    kinds = ["simple-lsh {}b: before", "simple-lsh {}b: after", "nr-lsh {}b: before",
             "nr-lsh {}b: after"]  # fmt: skip
    for ax, doc in zip(axes[0], docs, strict=True):
        by = {r["method"]: r["QPS @ r10=0.9 (CPU time)"] for r in doc["rows"]}
        bits = sorted({int(m.split()[1].rstrip("b:")) for m in by if m.startswith("nr-lsh")})
        for j, kind in enumerate(kinds):
            vals = [by.get(kind.format(b)) or 0 for b in bits]
            ax.bar(np.arange(len(bits)) + (j - 1.5) * 0.2, vals, 0.2, label=kind.format("n"))
        for lab, ls in (("exact (simsearch FlatIndex)", ":"), ("hnswlib ip (M=16)", "--")):
            if by.get(lab):
                ax.axhline(by[lab], ls=ls, color="k", lw=1, label=lab)
        ax.set_xticks(range(len(bits)), [f"{b} bits" for b in bits])
        ax.set_yscale("log")
        ax.set_ylabel("queries/s at recall@10 = 0.9 (CPU time, 1 thread)")
        ax.set_title(f"{doc['dataset']} n={doc['n']:,}")
        ax.legend(fontsize=7)
    fig.tight_layout()
    img.mkdir(parents=True, exist_ok=True)
    fig.savefig(img / "lsh-ab-qps.png", dpi=80)


if __name__ == "__main__":
    main()

"""NEQ against its base quantizer at equal bits, in the paper's form: recall@k (k = 20, 10) of
the true top-k among the top T items of the quantized scan, T = 1 .. 1024; plus queries/s of the
scan (NEQ-PQ vs faiss IndexPQ at the same code size, one thread, in one run).

Both sides train on the same sample with the same quantizer settings (faiss defaults, RQ beam
``--rq-beam`` on both, LSQ ``--lsq-iters`` and ``--lsq-ridge`` on both); PQ/OPQ pad the
dimension with zeros to a multiple of the number of codebooks (NEQ's M - 1, the baseline's M).

    python -m bench.quant.bench --dataset glove-50 --codebooks 4 8
    python -m bench.quant.bench --dataset synthetic-longtail --n 1000000 --dim 64
    python -m bench.quant.bench --sweep items   # crossover sweep over items (10k-300k)
    python -m bench.quant.bench --sweep axes    # dimension and norm spread at 30k items
    python -m bench.quant.bench --sweep small   # the ml100k-svd scale

Raw JSON goes to bench/results/quant/; Markdown tables are printed.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import numpy as np

from simsearch import datasets
from simsearch.eval import alternated_best_times, markdown_table, thread_limit
from simsearch.quant import NEQIndex, faiss_baseline, pad, padded_dim
from simsearch.quant.neq import LSQ_RIDGE

log = logging.getLogger("quant_bench")
TS = (1, 4, 16, 64, 256, 1024)
RESULTS = Path(__file__).resolve().parents[1] / "results" / "quant"


def recall_in_top_t(found: np.ndarray, gt: np.ndarray, k: int, ts=TS) -> dict[int, float]:
    """Fraction of the true top-k ids that appear among the first T found ids, per T."""
    gt = gt[:, :k]
    out = {}
    for t in ts:
        f = found[:, :t]
        hits = (f[:, :, None] == gt[:, None, :]).any(1).sum(1)
        out[t] = float(hits.mean() / k)
    return out


def load_data(name: str, n: int | None, dim: int | None, nq: int, norm_sigma: float | None,
              n_clusters: int | None):  # fmt: skip
    if name == "synthetic-longtail":
        p = {"n": n or 1_000_000, "dim": dim or 64}
        if norm_sigma is not None:
            p["norm_sigma"] = norm_sigma
        if n_clusters is not None:
            p["n_clusters"] = n_clusters
        ds = datasets.load(name, **p)
    elif name == "glove-50":
        ds = datasets.load(name) if n is None else datasets.load(name, n_base=n)
    else:
        ds = datasets.load(name)
    gt, _ = ds.ground_truth("ip", 100)
    return ds, ds.base, ds.queries[:nq], gt[:nq]


def run_pair(base_kind, M, xb, xq, xt, gt, args, tmax):
    """Build faiss's base quantizer (M codebooks) and NEQ over it (1 + (M - 1)); return rows."""
    dim = xb.shape[1]
    rows = []
    d = padded_dim(dim, M, base_kind)
    fb = faiss_baseline(base_kind, dim, M, 8, args.seed, args.rq_beam, args.lsq_iters,
                        args.lsq_ridge)  # fmt: skip
    t0 = time.perf_counter()
    fb.train(pad(xt, d))
    t1 = time.perf_counter()
    fb.add(pad(xb, d))
    t2 = time.perf_counter()
    _, found = fb.search(pad(xq, d), tmax)
    t3 = time.perf_counter()
    rows.append(("faiss", found, t1 - t0, t2 - t1, t3 - t2, d))
    neq = NEQIndex(
        dim, base=base_kind, n_codebooks=M, nbits=8, seed=args.seed,
        rq_beam_size=args.rq_beam, lsq_train_iters=args.lsq_iters, lsq_ridge=args.lsq_ridge,
        progress=False,
    )  # fmt: skip
    t0 = time.perf_counter()
    neq.train(xt)
    t1 = time.perf_counter()
    neq.add(xb)
    t2 = time.perf_counter()
    r = neq.search(xq, tmax)
    t3 = time.perf_counter()
    rows.append(("neq", r.ids, t1 - t0, t2 - t1, t3 - t2, neq.quantizer_dim))
    out = []
    for side, ids, tt, ta, ts_, dq in rows:
        rec = {
            "method": f"{base_kind.upper()}" if side == "faiss" else f"NEQ-{base_kind.upper()}",
            "base": base_kind, "side": side, "codebooks": M, "bits": 8 * M,
            "quantizer_dim": dq, "train_s": tt, "add_s": ta, "search_s": ts_,
        }  # fmt: skip
        for k in (20, 10):
            for t, v in recall_in_top_t(ids, gt, k).items():
                rec[f"r{k}@{t}"] = v
        out.append(rec)
        log.info("%s M=%d r20@64=%.3f train %.1fs add %.1fs search %.1fs", rec["method"], M,
                 rec["r20@64"], tt, ta, ts_)  # fmt: skip
    return out


def scan_qps(xb, xq, xt, M, args):
    """Queries/s at k=10 of NEQ-PQ's scan and faiss IndexPQ's, same code size, one thread,
    alternated and best-of-3 in this process."""
    dim = xb.shape[1]
    d = padded_dim(dim, M, "pq")
    fb = faiss_baseline("pq", dim, M, 8, args.seed)
    fb.train(pad(xt, d))
    fb.add(pad(xb, d))
    neq = NEQIndex(dim, base="pq", n_codebooks=M, progress=False)
    neq.train(xt)
    neq.add(xb)
    qf = pad(xq, d)
    neq.search(xq[:2], 10)  # compile outside the timing
    t_faiss, t_neq = alternated_best_times([lambda: fb.search(qf, 10),
                                            lambda: neq.search(xq, 10)], rounds=3)
    qf_, qn = len(xq) / t_faiss, len(xq) / t_neq
    return {"codebooks": M, "code_bytes": M, "n": len(xb), "nq": len(xq),
            "faiss_pq_qps": qf_, "neq_pq_qps": qn, "ratio": qn / qf_}  # fmt: skip


def table(rows, k):
    cols = ["method", "bits"] + [f"r{k}@{t}" for t in TS]
    return markdown_table(rows, cols)


def sweep(args):
    """Crossover: NEQ-PQ/RQ minus PQ/RQ recall@20 within top 64 at 4 codebooks, over items,
    dimension and norm spread (synthetic long-tailed data, 300 queries)."""
    out = []
    grid = []
    if args.sweep == "small":  # the ml100k-svd scale: 1,682 items, norm spread std(log) 1.3
        for n in (1_682, 3_000, 5_000):
            for sigma in (0.5, 1.3):
                grid.append({"n": n, "dim": 64, "norm_sigma": sigma})
    for n in (args.sweep_ns or (10_000, 30_000, 100_000, 300_000)) if args.sweep == "items" else ():
        grid.append({"n": n, "dim": 64, "norm_sigma": 0.5})
    # dimension and norm spread at 30k items (117 per codeword), near the RQ crossover
    for dim in (16, 32, 128) if args.sweep == "axes" else ():
        grid.append({"n": 30_000, "dim": dim, "norm_sigma": 0.5})
    for sigma in (0.0, 0.25, 1.0) if args.sweep == "axes" else ():
        grid.append({"n": 30_000, "dim": 64, "norm_sigma": sigma})
    for g in grid:
        xb, xq = datasets.synthetic_longtail(n=g["n"], dim=g["dim"], n_queries=300,
                                             norm_sigma=g["norm_sigma"], seed=1)  # fmt: skip
        gt = datasets.exact_knn(xb, xq, 20, "ip", desc="gt")[0]
        xt = xb[: min(len(xb), args.train_n)]
        for base_kind in args.bases:
            for M in args.codebooks:
                rows = run_pair(base_kind, M, xb, xq, xt, gt, args, 64)
                f, n_ = rows
                rec = dict(g, base=base_kind, codebooks=M, items_per_codeword=g["n"] / 256,
                           base_r20_64=f["r20@64"], neq_r20_64=n_["r20@64"],
                           base_r10_16=f["r10@16"], neq_r10_16=n_["r10@16"],
                           gain_r20_64=n_["r20@64"] - f["r20@64"])  # fmt: skip
                out.append(rec)
                log.info("sweep %s", rec)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dataset", default="ml100k-svd",
                    choices=["glove-50", "ml100k-svd", "synthetic-longtail"])  # fmt: skip
    ap.add_argument("--n", type=int, default=None, help="base rows (synthetic; glove: first n)")
    ap.add_argument("--dim", type=int, default=None, help="synthetic dimension")
    ap.add_argument("--norm-sigma", type=float, default=None)
    ap.add_argument("--n-clusters", type=int, default=None)
    ap.add_argument("--nq", type=int, default=300, help="queries used")
    ap.add_argument("--bases", nargs="+", default=["pq", "opq", "rq", "lsq"])
    ap.add_argument("--codebooks", nargs="+", type=int, default=[4, 8])
    ap.add_argument("--train-n", type=int, default=65_536, help="training sample (both sides)")
    ap.add_argument("--rq-beam", type=int, default=1, help="RQ beam, both sides")
    ap.add_argument("--lsq-iters", type=int, default=25, help="LSQ training iterations, both sides")
    ap.add_argument("--lsq-ridge", type=float, default=LSQ_RIDGE,
                    help="LSQ ridge lambda (faiss lambd), both sides; faiss's default is 0.01")
    ap.add_argument("--lsq-n", type=int, default=None, help="base rows for LSQ (if smaller)")
    ap.add_argument("--qps", action="store_true", help="also measure scan queries/s")
    ap.add_argument("--qps-only", action="store_true",
                    help="measure scan queries/s only (no recall curves; tag gets '-qps')")
    ap.add_argument("--sweep", choices=["items", "axes", "small"], default=None,
                    help="crossover sweep: items, axes (dim, norm spread), small")  # fmt: skip
    ap.add_argument("--sweep-ns", nargs="+", type=int, default=None,
                    help="item counts of --sweep items (default 10k 30k 100k 300k)")  # fmt: skip
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    RESULTS.mkdir(parents=True, exist_ok=True)
    with thread_limit(args.threads):
        if args.sweep:
            out = sweep(args)
            path = RESULTS / f"sweep-{args.sweep}{'-' + args.tag if args.tag else ''}.json"
            path.write_text(json.dumps({"args": vars(args), "rows": out}, indent=1))
            cols = [
                "base", "codebooks", "n", "dim", "norm_sigma", "items_per_codeword",
                "base_r20_64", "neq_r20_64", "gain_r20_64", "base_r10_16", "neq_r10_16",
            ]  # fmt: skip
            print(markdown_table(out, cols))
            return
        ds, xb, xq, gt = load_data(args.dataset, args.n, args.dim, args.nq, args.norm_sigma,
                                   args.n_clusters)  # fmt: skip
        rng = np.random.default_rng(args.seed)
        train_idx = np.sort(rng.choice(len(xb), min(len(xb), args.train_n), replace=False))
        xt = np.ascontiguousarray(xb[train_idx])
        log.info("%s: %d x %d, %d queries, train sample %d", ds.name, *xb.shape, len(xq), len(xt))
        tag = args.tag or f"{args.dataset}-{len(xb)}x{xb.shape[1]}"
        if args.qps_only:
            args.bases, args.qps, tag = [], True, args.tag or f"{tag}-qps"
        path = RESULTS / f"{tag}.json"

        def save(rows, qps):
            doc = {"args": vars(args), "n": len(xb), "dim": xb.shape[1], "train_n": len(xt),
                   "nq": len(xq), "rows": rows, "qps": qps}  # fmt: skip
            path.write_text(json.dumps(doc, indent=1))

        rows = []
        for base_kind in args.bases:
            xbb, gtb = xb, gt
            if base_kind == "lsq" and args.lsq_n and args.lsq_n < len(xb):
                # LSQ encodes slowly: a prefix of the base with its own ground truth
                xbb = xb[: args.lsq_n]
                gtb = datasets.exact_knn(xbb, xq, 20, "ip", desc="gt lsq")[0]
            for M in args.codebooks:
                for rec in run_pair(base_kind, M, xbb, xq, xt, gtb, args, max(TS)):
                    rec["n"] = len(xbb)
                    rows.append(rec)
                save(rows, [])  # partial results survive an interrupted run
        qps = [scan_qps(xb, xq, xt, M, args) for M in args.codebooks] if args.qps else []
        save(rows, qps)
    print(f"## {tag} (n={len(xb)}, dim={xb.shape[1]}, nq={len(xq)}, train={len(xt)})\n")
    for k in (20, 10) if rows else ():
        print(f"recall@{k} within top T\n")
        print(table(rows, k) + "\n")
    if qps:
        print(markdown_table(qps, list(qps[0])))
    print(f"\nraw: {path}")


if __name__ == "__main__":
    main()

"""Why NEQ-LSQ lost to LSQ at faiss's default ridge: LSQ's reconstruction error when encoding
its own training rows and held-out rows, and its codeword norms, over the ridge lambda (faiss
``lambd``), on unit directions with M - 1 codebooks (NEQ's side) and on raw vectors with M
(the baseline's side). One thread.

    python -m bench.diagnostics.quant_lsq_diag --dataset synthetic-longtail --n 50000 --dim 256
    python -m bench.diagnostics.quant_lsq_diag --dataset glove-50 --n 50000

Errors are relative: mean |v - decode(encode(v))|^2 / mean |v|^2 (1.0 = as bad as zero), for
the training rows re-encoded by LSQ's encoder (ICM from random codes) and for held-out rows.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import faiss
import numpy as np

from simsearch import datasets
from simsearch.eval import markdown_table, thread_limit

RESULTS = Path(__file__).resolve().parents[1] / "results" / "quant"


def rel_err(lsq, v: np.ndarray) -> float:
    dec = lsq.decode(lsq.compute_codes(v))
    return float(((v - dec) ** 2).sum(1).mean() / (v**2).sum(1).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dataset", default="synthetic-longtail",
                    choices=["glove-50", "synthetic-longtail"])  # fmt: skip
    ap.add_argument("--n", type=int, default=50_000)
    ap.add_argument("--dim", type=int, default=256, help="synthetic dimension")
    ap.add_argument("--train-n", type=int, default=10_000)
    ap.add_argument("--held-n", type=int, default=5_000)
    ap.add_argument("--codebooks", type=int, default=4, help="M (NEQ's direction side gets M - 1)")
    ap.add_argument("--lsq-iters", type=int, default=8)
    ap.add_argument("--ridges", nargs="+", type=float, default=[0.01, 0.1, 1.0, 10.0])
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    if args.dataset == "glove-50":
        ds = datasets.load("glove-50", n_base=args.n)
    else:
        ds = datasets.load("synthetic-longtail", n=args.n, dim=args.dim)
    perm = np.random.default_rng(0).permutation(len(ds.base))
    xt = np.ascontiguousarray(ds.base[np.sort(perm[: args.train_n])])
    xh = np.ascontiguousarray(ds.base[perm[args.train_n : args.train_n + args.held_n]])
    rows = []
    with thread_limit(1):
        faiss.omp_set_num_threads(1)
        for side, M in (
            ("unit directions (NEQ)", args.codebooks - 1),
            ("raw x (LSQ)", args.codebooks),
        ):
            vt, vh = xt, xh
            if side.startswith("unit"):
                vt = xt / np.linalg.norm(xt, axis=1, keepdims=True)
                vh = xh / np.linalg.norm(xh, axis=1, keepdims=True)
            for ridge in args.ridges:
                t = time.perf_counter()
                lsq = faiss.LocalSearchQuantizer(vt.shape[1], M, 8)
                lsq.train_iters, lsq.lambd, lsq.random_seed = args.lsq_iters, ridge, 0
                lsq.train(vt)
                cb = faiss.vector_to_array(lsq.codebooks).reshape(M * 256, -1)
                row = {"side": side, "codebooks": M, "ridge": ridge,
                       "train_reencoded": rel_err(lsq, vt), "held_out": rel_err(lsq, vh),
                       "codeword_norm_mean": float(np.linalg.norm(cb, axis=1).mean()),
                       "data_norm_mean": float(np.linalg.norm(vt, axis=1).mean()),
                       "seconds": time.perf_counter() - t}  # fmt: skip
                rows.append(row)
                print(row, flush=True)
    tag = args.tag or f"lsq-diag-{args.dataset}-{xt.shape[1]}d-m{args.codebooks}"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{tag}.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    cols = ["side", "codebooks", "ridge", "train_reencoded", "held_out", "codeword_norm_mean",
            "data_norm_mean"]  # fmt: skip
    print(markdown_table(rows, cols))


if __name__ == "__main__":
    main()

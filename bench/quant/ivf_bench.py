"""NEQ with its inverted-file coarse partition (``n_lists``, per-call ``n_probe``) against
faiss IndexIVFPQ with the inner-product metric at the same code size and number of lists:
recall@10 (of the true inner-product top 10, no re-ranking), recall@10 within the top 100,
and queries/s (k = 10) per n_probe, one thread, both indexes timed alternately in one process
(best of ``--repeats``).

    python -m bench.quant.ivf_bench --dataset synthetic-longtail --n 1000000 --dim 64
    python -m bench.quant.ivf_bench --dataset glove-50

Both train on the same sample; IndexIVFPQ encodes residuals to its (k-means, inner-product
assigned) list centroids with M codebooks; NEQ-PQ files items under spherical k-means
centroids of their directions and encodes the direction with M - 1 codebooks plus the norm.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path

import faiss
import numpy as np

from simsearch.eval import markdown_table, thread_limit
from simsearch.quant import NEQIndex, pad, padded_dim

from .bench import load_data

log = logging.getLogger("quant_ivf_bench")
RESULTS = Path(__file__).resolve().parents[1] / "results" / "quant"


def recall10(found: np.ndarray, gt: np.ndarray) -> float:
    """Fraction of the true top 10 among the found ids (all columns of ``found``)."""
    return float((found[:, :, None] == gt[:, None, :10]).any(1).mean())


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--dataset", default="synthetic-longtail",
                    choices=["glove-50", "ml100k-svd", "synthetic-longtail"])  # fmt: skip
    ap.add_argument("--n", type=int, default=None)
    ap.add_argument("--dim", type=int, default=None)
    ap.add_argument("--nq", type=int, default=300)
    ap.add_argument("--codebooks", type=int, default=8)
    ap.add_argument("--n-lists", type=int, default=1024)
    ap.add_argument("--n-probes", nargs="+", type=int, default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--train-n", type=int, default=65_536)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default=None)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    with thread_limit(1):
        faiss.omp_set_num_threads(1)
        ds, xb, xq, gt = load_data(args.dataset, args.n, args.dim, args.nq, None, None)
        rng = np.random.default_rng(args.seed)
        xt = np.ascontiguousarray(xb[np.sort(rng.choice(len(xb), min(len(xb), args.train_n),
                                                        replace=False))])  # fmt: skip
        dim, M, L = xb.shape[1], args.codebooks, args.n_lists
        d = padded_dim(dim, M, "pq")
        t = time.perf_counter()
        ivf = faiss.IndexIVFPQ(faiss.IndexFlatIP(d), d, L, M, 8, faiss.METRIC_INNER_PRODUCT)
        ivf.cp.seed = args.seed
        ivf.train(pad(xt, d))
        ivf.add(pad(xb, d))
        log.info("IndexIVFPQ built in %.1fs", time.perf_counter() - t)
        t = time.perf_counter()
        neq = NEQIndex(dim, base="pq", n_codebooks=M, n_lists=L, seed=args.seed, progress=False)
        neq.train(xt)
        neq.add(xb)
        log.info("NEQ-PQ (n_lists=%d) built in %.1fs", L, time.perf_counter() - t)
        qf = pad(xq, d)
        neq.search(xq[:2], 10, n_probe=2)  # compile outside the timing
        rows = []
        for p in args.n_probes:
            ivf.nprobe = p
            best = {"faiss": np.inf, "neq": np.inf}
            for _ in range(args.repeats):
                t = time.perf_counter()
                _, fi = ivf.search(qf, 10)
                best["faiss"] = min(best["faiss"], time.perf_counter() - t)
                t = time.perf_counter()
                r = neq.search(xq, 10, n_probe=p)
                best["neq"] = min(best["neq"], time.perf_counter() - t)
            # recall@10 within the top 100 (candidates for an exact re-rank), untimed
            fi100 = ivf.search(qf, 100)[1]
            r100 = neq.search(xq, 100, n_probe=p).ids
            row = {
                "n_probe": p, "ivfpq_r10": recall10(fi, gt), "neq_ivf_r10": recall10(r.ids, gt),
                "ivfpq_r10@100": recall10(fi100, gt), "neq_ivf_r10@100": recall10(r100, gt),
                "ivfpq_qps": len(xq) / best["faiss"], "neq_ivf_qps": len(xq) / best["neq"],
            }  # fmt: skip
            row["qps_ratio"] = row["neq_ivf_qps"] / row["ivfpq_qps"]
            rows.append(row)
            log.info("%s", row)
        tag = args.tag or f"ivf-{args.dataset}-{len(xb)}x{dim}-m{M}-l{L}"
        RESULTS.mkdir(parents=True, exist_ok=True)
        doc = {"args": vars(args), "n": len(xb), "dim": dim, "rows": rows}
        (RESULTS / f"{tag}.json").write_text(json.dumps(doc, indent=1))
    print(f"## {tag} (n={len(xb)}, dim={dim}, {M} bytes/item, {L} lists)\n")
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

"""Each compiled kernel against the numba kernel it replaced, on every instruction set, one thread.

    flock /tmp/simsearch-bench.lock python bench/kernels_bench.py [--n 200000]

- NEQ scan: 4-bit codes of synthetic-longtail (n x 64, 16 direction codebooks + the norm), all
  items scanned, top 100 kept, 1,000 queries: the numba float-table scan (quant._kernels) and the
  compiled fast-scan (8-bit tables, 32 items per shuffle).
- Exact re-rank of 200 candidates per query: numba (quant._kernels.rerank_batch) and compiled.
- ip-NSW+ walk on glove-50 (100,000 words, ef 64, 1,000 queries): numba float walk
  (``search_reference``), the compiled float walk and the compiled sq8 walk.
Each time is the best of 3 batches; "x numba" is the numba time over the kernel's.
"""

from __future__ import annotations

import argparse

import numpy as np

import simsearch as ss
from simsearch import datasets, simd
from simsearch.eval import best_time, markdown_table, thread_limit
from simsearch.quant import _kernels as QK
from simsearch.quant import fastscan as FS


def neq_rows(n: int) -> list[dict]:
    ds = datasets.load("synthetic-longtail", n=n)
    x, q = ds.base, ds.queries[:1000]
    idx = ss.create_index("neq", 64, "ip", base="pq", n_codebooks=17, nbits=4, progress=False)
    idx.train(x[:50_000])
    codes, norm_codes = idx.encode_directions(x)[0], np.zeros(n, np.uint8)
    lut = idx.lookup_tables(q)
    cb = np.ascontiguousarray(np.sort(np.random.default_rng(0).uniform(0.5, 2, 16)), np.float32)
    offsets = np.array([0, n], np.int64)
    blocks = FS.pack(codes, norm_codes, offsets)
    rows = []
    t_ref = best_time(lambda: QK.scan_lists_batch(lut, codes, norm_codes, cb, 100,
                                                      *QK.whole(n, len(q)), True))
    rows.append({"kernel": "NEQ scan (n x 16 codes, top 100)", "path": "numba", "ms/query":
                 1e3 * t_ref / len(q), "items/s": n * len(q) / t_ref, "x numba": 1.0})
    for isa in simd.supported():
        with simd.use_isa(isa):
            def run():
                q8, scale, bias = FS.quantize_luts(lut, blocks.n_pairs)
                return FS.scan(blocks, q8, scale, bias, cb, 100, None, True)
            t = best_time(run)
        rows.append({"kernel": "NEQ scan (n x 16 codes, top 100)", "path": f"compiled {isa}",
                     "ms/query": 1e3 * t / len(q), "items/s": n * len(q) / t,
                     "x numba": t_ref / t})
    cand = np.random.default_rng(1).integers(0, n, (len(q), 200))
    t_ref = best_time(lambda: QK.rerank_batch(cand, x, q, 10))
    rows.append({"kernel": "exact re-rank (200 of n x 64)", "path": "numba",
                 "ms/query": 1e3 * t_ref / len(q), "x numba": 1.0})
    for isa in simd.supported():
        with simd.use_isa(isa):
            t = best_time(lambda: FS.rerank(cand, x, q, 10))
        rows.append({"kernel": "exact re-rank (200 of n x 64)", "path": f"compiled {isa}",
                     "ms/query": 1e3 * t / len(q), "x numba": t_ref / t})
    return rows


def graph_rows() -> list[dict]:
    ds = datasets.load("glove-50", n_base=100_000, n_queries=1000)
    idx = ss.create_index("ipnsw-plus", 50, "ip", M=16, progress=False, sq8=True)
    idx.add(ds.base)
    flat = ss.create_index("ipnsw-plus", 50, "ip", M=16, progress=False, sq8=False)
    flat.add(ds.base)
    q = ds.queries
    label = "ip-NSW+ walk (glove-50 100k, ef 64)"
    t_ref = best_time(lambda: flat.search_reference(q, 10, 64))
    rows = [{"kernel": label, "path": "numba float", "ms/query": 1e3 * t_ref / len(q),
             "x numba": 1.0}]
    for isa in simd.supported():
        with simd.use_isa(isa):
            for name, i in (("float", flat), ("sq8", idx)):
                t = best_time(lambda i=i: i.search(q, 10, ef=64))
                rows.append({"kernel": label, "path": f"compiled {isa} {name}",
                             "ms/query": 1e3 * t / len(q), "x numba": t_ref / t})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=200_000)
    a = ap.parse_args()
    with thread_limit(1):
        rows = neq_rows(a.n) + graph_rows()
    print(markdown_table(rows, ["kernel", "path", "ms/query", "items/s", "x numba"]))


if __name__ == "__main__":
    main()

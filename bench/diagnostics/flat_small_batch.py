"""The flat index's exact scan for a few queries: the compiled one-pass kernel against the BLAS
score matrix + top-k it replaces, one thread.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/flat_small_batch.py

Times ``_simd.flat_topk`` and the score-matrix path (``exact_scores`` + ``topk_from_scores``) on
random float32 data for each (dim, n, queries), interleaved, best of 5 rounds; prints BLAS's time
over the kernel's (above 1: the kernel is faster). ``simsearch._exact.exact_topk`` takes the
kernel where this table says it wins (docs/kernels.md, "The flat scan").
"""

from __future__ import annotations

import time

import numpy as np

from simsearch import _simd
from simsearch._exact import exact_scores, topk_from_scores
from simsearch.eval import markdown_table, thread_limit

NQ = (1, 2, 4, 8, 16, 32)


def best(fn, reps: int) -> float:
    out = np.inf
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        out = min(out, (time.perf_counter() - t) / reps)
    return out


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    with thread_limit(1):
        for d in (32, 64, 256, 960):
            for n in (1000, 20000):
                x = rng.standard_normal((n, d)).astype(np.float32)
                ids = np.arange(n, dtype=np.int64)
                row = {"dim": d, "n": n}
                for nq in NQ:
                    q = rng.standard_normal((nq, d)).astype(np.float32)
                    reps = max(5, int(2e5 / (n * d / 64 * nq)))
                    kernel = best(lambda q=q, x=x, ids=ids: _simd.flat_topk(q, x, ids, None, 10),
                                  reps)
                    blas = best(lambda q=q, x=x, ids=ids: topk_from_scores(
                        exact_scores(q, x, "ip"), 10, True, ids), reps)
                    row[f"{nq} queries"] = f"{blas / kernel:.2f}"
                rows.append(row)
                print(row, flush=True)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

"""The compiled flat scan of one query by itself: nanoseconds per stored row, one thread.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/flat_topk_rows.py

Times ``_simd.flat_topk`` (k = 10) on random float32 rows for each (dim, n), best of 5 rounds,
and prints ns per row (docs/kernels.md, "The flat scan"). Against another checkout's build:
bench/ab/sitecustomize.py.
"""

from __future__ import annotations

import time

import numpy as np

from simsearch import _simd
from simsearch.eval import markdown_table


def main() -> None:
    rows = []
    for d in (64, 100, 256):
        row: dict = {"dim": d}
        for n in (1_000, 10_000, 100_000):
            rng = np.random.default_rng(d + n)
            x = rng.standard_normal((n, d)).astype(np.float32)
            ids = np.arange(n, dtype=np.int64)
            q = rng.standard_normal((1, d)).astype(np.float32)
            reps = max(20, 20_000_000 // (n * d))
            best = np.inf
            for _ in range(5):
                t = time.perf_counter()
                for _ in range(reps):
                    _simd.flat_topk(q, x, ids, None, 10)
                best = min(best, (time.perf_counter() - t) / reps)
            row[f"n = {n:,}"] = f"{best / n * 1e9:.2f}"
        rows.append(row)
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

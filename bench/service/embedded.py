"""Embedded mode's cost over the in-process index: batch-1 searches, alternated.

    python bench/service/embedded.py --kind hnsw --n 20000 --rounds 4

Times ``simsearch.connect(":memory:")``'s collection and the same kind built in process, on the
same data, one query per call, back to back, alternating between the two per round; prints a
Markdown table and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import simsearch as ss


def rate(search, q: np.ndarray, seconds: float) -> float:
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        search(q[n % len(q) : n % len(q) + 1])
        n += 1
    return n / (time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kind", default="hnsw", choices=["hnsw", "flat"])
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--seconds", type=float, default=2.0)
    a = p.parse_args(argv)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, a.dim)).astype(np.float32)
    q = rng.standard_normal((1000, a.dim)).astype(np.float32)
    local = ss.create_index(a.kind, a.dim, "l2")
    local.add(x)
    with ss.connect(":memory:") as c:
        col = c.create_collection("bench", a.dim, "l2", a.kind)
        col.add(x)
        rows = []
        for r in range(a.rounds):
            rows.append((r + 1, rate(lambda b: local.search(b, a.k), q, a.seconds),
                         rate(lambda b: col.search(b, a.k), q, a.seconds)))
    print(f"{a.kind}, {a.n} x {a.dim}, k={a.k}, batch 1, one thread\n")
    print("| round | in process q/s | embedded q/s | ratio |\n|---|---|---|---|")
    for r, li, em in rows:
        print(f"| {r} | {li:,.0f} | {em:,.0f} | {li / em:.2f} |")
    li, em = np.median([r[1] for r in rows]), np.median([r[2] for r in rows])
    print(f"\nmedians: in process {li:,.0f} q/s, embedded {em:,.0f} q/s: embedded takes "
          f"{li / em:.2f}x the in-process time per query")


if __name__ == "__main__":
    main()

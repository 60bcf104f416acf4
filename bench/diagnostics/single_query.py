"""Single-query search calls, one thread: what a node or a Pyramid part pays per request.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/single_query.py [--rounds 3]

Builds ip-NSW+ (defaults) and a flat index on synthetic-longtail 50,000 x 64 (the built graph is
kept in the temp directory, so a before/after pair through bench/ab/sitecustomize.py searches the
same graph), then times 1,000 held-out queries one call each, per round, and prints q/s.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import thread_limit
from simsearch.graph import IPNSWPlus


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    x, q = synthetic_longtail(n=50_000, dim=64, n_queries=1000, seed=0)
    saved = Path(tempfile.gettempdir()) / "simsearch-single-query-ipnsw.ssx"
    if not saved.exists():
        g = IPNSWPlus(64)
        g.add(x)
        g.save(saved)
    flat = ss.FlatIndex(64, "ip")
    flat.add(x)
    indexes = {"ip-NSW+ (defaults)": ss.load(saved), "flat": flat}
    with thread_limit(1):
        for r in range(a.rounds):
            for name, idx in indexes.items():
                t = time.perf_counter()
                for i in range(len(q)):
                    idx.search(q[i : i + 1], 10)
                print(f"round {r + 1}: {name}: {len(q) / (time.perf_counter() - t):,.0f} q/s",
                      flush=True)


if __name__ == "__main__":
    main()

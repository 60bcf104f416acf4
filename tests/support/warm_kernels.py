"""Compile the numba kernels before the suite starts (.ci/run, beside the linters, which use one
core): each kind of the contract suite built, searched (plain, filtered, per query) and written
on small data, in this one process. numba caches what it compiles (cache=True), so the test
workers and the node, shard and coordinator processes they start load the kernels instead of
compiling them (a fresh clone's suite ran 74 s longer than a warm one's on 2 cores)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))


def main(part: int = 0, parts: int = 1) -> None:
    """Warm the kernels of every ``parts``-th case from ``part`` (two processes split them)."""
    import simsearch as ss
    from contract import CASES, dim_of, items_of
    from simsearch._kernels import merge_topk

    t0 = time.monotonic()
    merge_topk(np.full((1, 1), -1, np.int64), np.zeros((1, 1), np.float32), 1, True)
    for case in CASES[part::parts]:
        if case.items == "strings":
            continue  # torch's, not numba's
        for metric in case.metrics:
            dim = dim_of(case, 16)
            x, q = items_of(case, 600, 8, dim, 0)
            idx = case.make(dim, metric, x)
            idx.add(x)
            idx.search(q, 5, **case.search_kw)
            idx.search(q, 5, allow=np.arange(0, 600, 3), **case.search_kw)
            idx.search(q, 5, deny=[np.arange(i, 40) for i in range(len(q))], **case.search_kw)
            if case.supports_remove:
                idx.remove(np.arange(10))
            ss.loads(idx.to_bytes()).search(q[:1], 3, **case.search_kw)
    print(f"numba kernels compiled or loaded in {time.monotonic() - t0:.0f} s", flush=True)


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))

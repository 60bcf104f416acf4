"""What a one-item write costs a collection with many items and attribute columns, and what it
costs the searches running meanwhile (docs/bench/service.md, "Attribute writes").

    python bench/service/attribute_writes.py [--items 1000000] [--columns 64] [--writes 300]

A collection (flat index, dim 16) on /dev/shm (so that fsync is free and what is timed is the
collection's own work), N items with C columns (ints, floats, keywords, bools, keyword lists);
then one-item adds (ids interleaved with the held ones, as hashed framework ids are) and
removes, timed one by one: median and p99 (a remove's cost is mostly the flat index's own:
it copies its rows). Then searches with a ``where`` selecting about 10% (batch 1, one
thread), alone and while a second thread adds one item after another: their p99 quiet and
under writes.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

DIM = 16


def _attributes(rng: np.random.Generator, n: int, columns: int) -> dict[str, list]:
    out: dict[str, list] = {}
    kinds = ("int", "float", "keyword", "bool", "keywords")
    for c in range(columns):
        kind = kinds[c % len(kinds)]
        if kind == "int":
            out[f"c{c}"] = rng.integers(0, 1000, n).tolist()
        elif kind == "float":
            out[f"c{c}"] = rng.random(n).tolist()
        elif kind == "keyword":
            out[f"c{c}"] = [f"w{v}" for v in rng.integers(0, 50, n).tolist()]
        elif kind == "bool":
            out[f"c{c}"] = (rng.random(n) < 0.5).tolist()
        else:
            out[f"c{c}"] = [[f"t{v}"] for v in rng.integers(0, 20, n).tolist()]
    return out


def _pct(xs: list[float], p: float) -> float:
    return float(np.percentile(np.asarray(xs), p))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--columns", type=int, default=64)
    ap.add_argument("--writes", type=int, default=300)
    ap.add_argument("--searches", type=int, default=400)
    a = ap.parse_args(argv)

    from simsearch.service.store import Store

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else None
    d = Path(tempfile.mkdtemp(prefix="attrbench-", dir=base))
    try:
        store = Store(d)
        col = store.create("c", DIM, "l2", "flat", {})
        rng = np.random.default_rng(0)
        step = 100_000
        t0 = time.perf_counter()
        for s in range(0, a.items, step):  # even ids: the writes below fall between them
            m = min(step, a.items - s)
            col.add(rng.standard_normal((m, DIM)).astype(np.float32),
                    np.arange(s, s + m) * 2, attributes=_attributes(rng, m, a.columns))
            print(f"  built {s + m:,} items ({time.perf_counter() - t0:.0f} s)", flush=True)
        one = _attributes(rng, 1, a.columns)
        x1 = rng.standard_normal((1, DIM)).astype(np.float32)
        odd = rng.permutation(a.items)[: a.writes] * 2 + 1
        adds, removes = [], []
        for i in odd.tolist():
            t = time.perf_counter()
            col.add(x1, [i], attributes=one)
            adds.append(time.perf_counter() - t)
        for i in odd.tolist():
            t = time.perf_counter()
            col.remove(np.array([i]))
            removes.append(time.perf_counter() - t)
        print(f"\n{a.items:,} items x {a.columns} columns")
        print("| write | median ms | p99 ms |\n|---|---|---|")
        for name, xs in (("one-item add", adds), ("one-item remove", removes)):
            print(f"| {name} | {statistics.median(xs) * 1e3:.2f} | {_pct(xs, 99) * 1e3:.2f} |")

        q = rng.standard_normal((1, DIM)).astype(np.float32)
        where = {"c0": {"lt": 100}}  # about 10% of the items

        def searches(n: int) -> list[float]:
            out = []
            for _ in range(n):
                t = time.perf_counter()
                col.search(q, 10, where=where)
                out.append(time.perf_counter() - t)
            return out

        quiet = searches(a.searches)
        stop = threading.Event()

        def writer():  # one-item adds, one after another (a remove's cost is the index's)
            k = 2 * a.items + 1
            while not stop.is_set():
                col.add(x1, [k], attributes=one)
                k += 2

        w = threading.Thread(target=writer)
        w.start()
        try:
            busy = searches(a.searches)
        finally:
            stop.set()
            w.join()
        print("\n| searches (where, batch 1) | median ms | p99 ms |\n|---|---|---|")
        for name, xs in (("quiet", quiet), ("while one thread writes", busy)):
            print(f"| {name} | {statistics.median(xs) * 1e3:.2f} | {_pct(xs, 99) * 1e3:.2f} |")
        print(f"\np99 under writes / quiet: {_pct(busy, 99) / _pct(quiet, 99):.2f}")
        store.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

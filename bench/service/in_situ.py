"""Where a batch-1 search spends its time inside the node, timed in the serving process.

    python bench/service/in_situ.py [--calls 4000] [--n 1000] [--detail]

Starts a node whose Search handler and the stages under it (query decoding, the collection,
``Index.search``, the index's own ``_search``, the response encoding) are wrapped with timers,
makes ``--calls`` single-query searches through the generated stub on a flat collection of
``--n`` x 64, and prints each stage's median and mean microseconds per call (the last 3,000
calls). ``--detail`` adds the steps under them (validation, the two read locks, the deadline
check, the top-k scan), each timer adding its own cost to the stages above it. Called in a loop
the same handler is several times faster: between gRPC calls its code and data start cold.
Against another checkout's code: bench/ab/sitecustomize.py.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# (module, class or None, attribute, label): the stages timed, outermost first
STAGES = [
    ("simsearch.service.servicer", "SimSearchServicer", "Search", "handler"),
    ("simsearch.service.convert", None, "items_from", "decode queries"),
    ("simsearch.service.collection", "Collection", "search", "Collection.search"),
    ("simsearch.index", "Index", "search", "Index.search"),
    ("simsearch.flat", "FlatIndex", "_search", "FlatIndex._search"),
    ("simsearch.service.convert", None, "to_search_response", "encode response"),
]
DETAIL = [
    ("simsearch.service.store", "Store", "get", "store.get"),
    ("simsearch.service.convert", None, "load_params", "load params_json"),
    ("simsearch._rwlock", "RWLock", "acquire_read", "RWLock.acquire_read (x2)"),
    ("simsearch._rwlock", "RWLock", "release_read", "RWLock.release_read (x2)"),
    ("simsearch.index", None, "check_deadline", "check_deadline"),
    ("simsearch.index", None, "as_matrix", "as_matrix"),
    ("simsearch.index", None, "pad_result", "pad_result"),
    ("simsearch.flat", None, "exact_topk", "exact_topk"),
]


def serve(argv: list[str]) -> int:
    """The node, its stages timed; prints the table's rows as JSON on exit."""
    import atexit
    import importlib

    from simsearch.service import server

    times: dict[str, list[float]] = collections.defaultdict(list)
    stages = STAGES + (DETAIL if os.environ.get("IN_SITU_DETAIL") else [])
    for module, cls, attr, label in stages:
        owner = importlib.import_module(module)
        owner = getattr(owner, cls) if cls else owner
        orig = getattr(owner, attr)

        def timed(*a, _orig=orig, _label=label, **kw):
            t = time.perf_counter()
            try:
                return _orig(*a, **kw)
            finally:
                times[_label].append(time.perf_counter() - t)
        setattr(owner, attr, timed)  # callers look it up at call time: module.name, self.name

    def report():
        rows = [{"stage": label, "calls": len(times[label]),
                 "median µs": round(float(np.median(np.array(times[label][-3000:]) * 1e6)), 1),
                 "mean µs": round(float(np.mean(np.array(times[label][-3000:]) * 1e6)), 1)}
                for *_, label in stages if times[label]]
        print("IN_SITU " + json.dumps(rows), file=sys.stderr, flush=True)
    atexit.register(report)
    return server.main(argv)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=4000)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--detail", action="store_true")
    a = p.parse_args()
    from simsearch.eval import markdown_table
    from simsearch.service import convert
    from simsearch.service.client import connect

    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, 64)).astype(np.float32)
    qs = rng.standard_normal((200, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        ready = Path(tmp) / "ready.json"
        node = subprocess.Popen(
            [sys.executable, __file__, "--serve", "--data-dir", f"{tmp}/data", "--port", "0",
             "--ready-file", str(ready), "--threads", "1", "--workers", "8",
             "--log-level", "WARNING"],
            stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "IN_SITU_DETAIL": "1" if a.detail else ""})
        try:
            t0 = time.monotonic()
            while not ready.exists():
                if node.poll() is not None or time.monotonic() - t0 > 60:
                    raise RuntimeError("the node did not start")
                time.sleep(0.05)
            client = connect(f"127.0.0.1:{json.loads(ready.read_text())['port']}", timeout=60)
            col = client.create_collection("c", 64, "ip", "flat")
            col.add(x)
            pb, stub = client._pb, client._stub
            for i in range(a.calls):
                stub.Search(pb.SearchRequest(collection="c", k=10,
                                             queries=convert.to_matrix(qs[i % 200 : i % 200 + 1])),
                            timeout=60)
            client.close()
        finally:
            node.terminate()
            _, err = node.communicate(timeout=60)
    line = next((ln for ln in err.splitlines() if ln.startswith("IN_SITU ")), None)
    if line is None:
        print(err, file=sys.stderr)
        return 1
    rows = json.loads(line[len("IN_SITU "):])
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        sys.exit(serve(sys.argv[2:]))
    sys.exit(main())

"""A hostile ``where`` beside plain searches: what it costs everyone else (docs/bench/service.md,
"A hostile where").

    python bench/service/hostile_where.py [--n 20000] [--clauses 200000] [--seconds 6]

Starts a node with a flat collection of ``--n`` items (dim 64) and an int attribute, then for
each configuration (the default limits, and limits raised so the filter is parsed and evaluated
until the call's deadline) measures one client's batch-1 plain searches: first on a quiet node,
then while another client sends a ``where`` of ``--clauses`` ``$or`` clauses (about 4 MB of
JSON at 200,000) with a ``--deadline``, back to back or every ``--interval`` seconds. Prints
per configuration the plain searches' p50 / p99 in both phases and how the hostile calls ended
(status, time to the answer).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import grpc
import numpy as np

from simsearch.eval import markdown_table
from simsearch.service.client import connect
from simsearch.service.protos.simsearch.v1 import simsearch_pb2 as pb
from simsearch.service.protos.simsearch.v1 import simsearch_pb2_grpc as pb_grpc

DIM = 64


def start_node(d: Path, *flags: str) -> tuple[subprocess.Popen, int]:
    ready = d / "ready.json"
    proc = subprocess.Popen([sys.executable, "-m", "simsearch.service.server", "--data-dir",
                             str(d / "data"), "--port", "0", "--ready-file", str(ready),
                             "--log-level", "ERROR", *flags], stdin=subprocess.DEVNULL)
    t0 = time.monotonic()
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() - t0 > 60:
            raise RuntimeError("the node did not start")
        time.sleep(0.05)
    return proc, json.loads(ready.read_text())["port"]


def plain_latencies(address: str, q: np.ndarray, seconds: float) -> np.ndarray:
    with connect(address, timeout=30) as c:
        col = c.collection("c")
        out, t_end, i = [], time.monotonic() + seconds, 0
        while time.monotonic() < t_end:
            t0 = time.perf_counter()
            col.search(q[i % len(q)], 10)
            out.append(time.perf_counter() - t0)
            i += 1
    return np.asarray(out) * 1e3


def hostile_loop(address: str, where_json: str, deadline: float, interval: float,
                 stop: threading.Event, outcomes: list) -> None:
    stub = pb_grpc.SimSearchStub(grpc.insecure_channel(
        address, options=[("grpc.max_send_message_length", -1)]))
    req = pb.SearchRequest(collection="c", k=10, where_json=where_json, queries=pb.Matrix(
        data=np.ones(DIM, "<f4").tobytes(), rows=1, cols=DIM))
    while not stop.is_set():
        t0 = time.perf_counter()
        try:
            stub.Search(req, timeout=deadline)
            code = "OK"
        except grpc.RpcError as err:
            code = err.code().name
        outcomes.append((code, time.perf_counter() - t0))
        stop.wait(max(0.0, interval - (time.perf_counter() - t0)))


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--clauses", type=int, default=200_000)
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--deadline", type=float, default=2.0)
    p.add_argument("--interval", type=float, default=0.0,
                   help="seconds from one hostile call's start to the next (0: back to back)")
    a = p.parse_args()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, DIM)).astype(np.float32)
    q = rng.standard_normal((200, DIM)).astype(np.float32)
    where = json.dumps({"$or": [{"n": i} for i in range(a.clauses)]})
    configs = {"default limits": (),
               "limits raised": ("--max-where-bytes", str(1 << 30), "--max-where-clauses",
                                 str(10 * a.clauses), "--max-message-bytes", str(1 << 28))}
    rows = []
    for name, flags in configs.items():
        with tempfile.TemporaryDirectory() as tmp:
            proc, port = start_node(Path(tmp), *flags)
            address = f"127.0.0.1:{port}"
            try:
                with connect(address, timeout=120) as c:
                    c.create_collection("c", DIM, "l2", "flat").add(
                        x, attributes={"n": list(range(a.n))})
                quiet = plain_latencies(address, q, a.seconds)
                stop, outcomes = threading.Event(), []
                t = threading.Thread(target=hostile_loop,
                                     args=(address, where, a.deadline, a.interval, stop,
                                           outcomes))
                t.start()
                time.sleep(0.5)
                loaded = plain_latencies(address, q, a.seconds)
                stop.set()
                t.join(60)
            finally:
                proc.kill()
                proc.wait()
        codes = sorted({c for c, _ in outcomes})
        took = np.asarray([s for _, s in outcomes]) * 1e3
        rows.append({
            "limits": name,
            "quiet p50 / p99 ms": f"{np.percentile(quiet, 50):.2f} / "
                                  f"{np.percentile(quiet, 99):.2f}",
            "hostile p50 / p99 ms": f"{np.percentile(loaded, 50):.2f} / "
                                    f"{np.percentile(loaded, 99):.2f}",
            "p99 ratio": round(float(np.percentile(loaded, 99) / np.percentile(quiet, 99)), 2),
            "hostile calls": len(outcomes),
            "answered with": ",".join(codes),
            "hostile answer ms (max)": round(float(took.max()), 1) if took.size else None,
        })
        print(rows[-1], flush=True)
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

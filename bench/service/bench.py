"""Searches per second over gRPC against the same index in process, and against a bare gRPC
echo moving the same bytes.

    python bench/service/bench.py [--n 50000] [--dim 64] [--kind hnsw] [--seconds 3]
        [--rounds 1] [--metrics]

Starts a node (``python -m simsearch.service.server``, port 0) in a subprocess, loads the data
through the client, snapshots it, and loads that snapshot file in this process, so both sides
search the very same index. Then, for batch sizes 1 and 100 and 1 or several concurrent clients
(threads, each with its own channel), it counts queries per second for a fixed wall time. Every
search runs with one BLAS/faiss thread on both sides (server ``--threads 1``). The echo
(bench/service/echo_server.py, its own process, as many workers) answers each call with as many
bytes as the search's response, so ``echo_ratio`` = echo calls/s over search calls/s is what the
node costs above gRPC itself. ``--metrics`` serves the node's Prometheus metrics meanwhile. Raw
results go to bench/results/service.json; a Markdown table is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.eval import markdown_table, thread_limit
from simsearch.service.client import connect


def start_echo(tmp: Path, workers: int) -> tuple[subprocess.Popen, int]:
    ready = tmp / "echo.json"
    echo = Path(__file__).parent / "echo_server.py"
    proc = subprocess.Popen([sys.executable, str(echo), str(ready), str(workers)],
                            stdin=subprocess.DEVNULL)
    return proc, _wait_ready(proc, ready, "echo server", 60)


def _wait_ready(proc: subprocess.Popen, ready: Path, what: str, timeout: float) -> int:
    """The port a child process wrote to its ready file."""
    t0 = time.monotonic()
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() - t0 > timeout:
            raise RuntimeError(f"{what} did not start")
        time.sleep(0.05)
    return json.loads(ready.read_text())["port"]


def echo_search(port: int, dim: int, k: int):
    """A ``search(i) -> fn(queries)`` whose calls move a search's bytes through the echo."""
    import grpc

    def make(i):
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        call = channel.unary_unary("/echo.Echo/Call")

        def fn(q):
            answer = len(q) * k * 12 + 16  # ids (8 B) and scores (4 B) per result
            return call(answer.to_bytes(4, "little") + bytes(len(q) * dim * 4), timeout=60)

        return fn

    return make


def start_server(data_dir: Path, workers: int, metrics: bool = False
                 ) -> tuple[subprocess.Popen, int]:
    ready = data_dir.parent / "ready.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "simsearch.service.server",
            "--data-dir",
            str(data_dir),
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--threads",
            "1",
            "--workers",
            str(workers),
            "--max-concurrent-rpcs",
            "0",
            "--log-level",
            "WARNING",
            *(["--metrics-port", "0"] if metrics else []),
        ],
        stdin=subprocess.DEVNULL,
    )
    return proc, _wait_ready(proc, ready, "server", 120)


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU time of another process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(
    search,
    queries: np.ndarray,
    batch: int,
    clients: int,
    seconds: float,
    server_pid: int | None = None,
) -> tuple[float, float]:
    """Queries per second with ``clients`` threads each calling ``search(batch_of_queries)``
    back to back for ``seconds``, and CPU microseconds per query (this process plus the server
    process, if any): on a shared machine the CPU cost is the steadier comparison."""
    counts = [0] * clients
    start = threading.Barrier(clients + 1)
    stop = threading.Event()

    def run(i: int) -> None:
        fn = search(i)
        rng = np.random.default_rng(i)
        start.wait()
        while not stop.is_set():
            s = int(rng.integers(0, len(queries) - batch + 1))
            fn(queries[s : s + batch])
            counts[i] += batch

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    t0, c0 = time.perf_counter(), time.process_time()
    s0 = process_cpu_seconds(server_pid) if server_pid else 0.0
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if server_pid:
        cpu += process_cpu_seconds(server_pid) - s0
    n = sum(counts)
    return n / wall, 1e6 * cpu / max(n, 1)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=50_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--kind", default="hnsw", choices=["hnsw", "flat"])
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--rounds", type=int, default=1,
                   help="time gRPC and the echo alternately this many times (--seconds each); "
                        "echo_ratio is the median of the rounds' ratios")
    p.add_argument("--batches", default="1,100")
    p.add_argument("--clients", default="1,4")
    p.add_argument("--metrics", action="store_true", help="the node serves Prometheus metrics")
    p.add_argument("--out", default="bench/results/service.json")
    args = p.parse_args(argv)

    base, queries = synthetic_longtail(n=args.n, dim=args.dim, n_queries=2000, seed=0)
    build = {"M": 16, "ef_construction": 100} if args.kind == "hnsw" else {}
    search_kw = {"ef": 64} if args.kind == "hnsw" else {}
    batches = [int(b) for b in args.batches.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as tmp, thread_limit(1):
        data_dir = Path(tmp) / "data"
        workers = max(8, 2 * max(clients))
        proc, port = start_server(data_dir, workers=workers, metrics=args.metrics)
        echo, echo_port = start_echo(Path(tmp), workers)
        try:
            address = f"127.0.0.1:{port}"
            admin = connect(address, timeout=600)
            t = time.perf_counter()
            col = admin.create_collection("bench", args.dim, "ip", args.kind, **build)
            col.add(base)
            col.snapshot()
            print(
                f"loaded {args.n} x {args.dim} {args.kind} in {time.perf_counter() - t:.1f} s",
                flush=True,
            )
            snap = next((data_dir / "collections" / "bench").glob("snapshot-*.idx"))
            local = ss.load(snap)  # the very same index, in this process
            a, b = (
                local.search(queries[:50], args.k, **search_kw),
                col.search(queries[:50], args.k, **search_kw),
            )
            assert np.array_equal(a.ids, b.ids), "local and remote answers differ"
            remotes = [connect(address, timeout=600) for _ in range(max(clients))]

            def local_search(i):
                return lambda q: local.search(q, args.k, **search_kw)

            def remote_search(i):
                c = remotes[i].collection("bench")
                return lambda q: c.search(q, args.k, **search_kw)

            for batch in batches:
                for nc in clients:
                    qps, cpu = {}, {}
                    qps["in-process"], cpu["in-process"] = throughput(
                        local_search, queries, batch, nc, args.seconds)
                    echo_fn = echo_search(echo_port, args.dim, args.k)
                    rounds: dict[str, list] = {"gRPC": [], "echo": []}
                    for _ in range(args.rounds):  # alternated: the machine drifts
                        for mode, fn, pid in (("gRPC", remote_search, proc.pid),
                                              ("echo", echo_fn, echo.pid)):
                            rounds[mode].append(
                                throughput(fn, queries, batch, nc, args.seconds, pid))
                    for mode, got in rounds.items():
                        qps[mode] = float(np.median([g[0] for g in got]))
                        cpu[mode] = float(np.median([g[1] for g in got]))
                    ratio = float(np.median([e[0] / g[0] for e, g in
                                             zip(rounds["echo"], rounds["gRPC"], strict=True)]))
                    row = {
                        "kind": args.kind,
                        "batch": batch,
                        "clients": nc,
                        "metrics": args.metrics,
                        "in_process_qps": round(qps["in-process"]),
                        "grpc_qps": round(qps["gRPC"]),
                        "echo_qps": round(qps["echo"]),
                        "qps_ratio": round(qps["gRPC"] / qps["in-process"], 3),
                        "echo_ratio": round(ratio, 3),
                        "in_process_cpu_us_per_q": round(cpu["in-process"], 1),
                        "grpc_cpu_us_per_q": round(cpu["gRPC"], 1),
                        "cpu_efficiency": round(cpu["in-process"] / cpu["gRPC"], 3),
                    }
                    rows.append(row)
                    print(row, flush=True)
            for c in remotes:
                c.close()
            admin.close()
        finally:
            for p_ in (proc, echo):
                p_.send_signal(signal.SIGTERM)
                p_.wait(60)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "n": args.n,
        "dim": args.dim,
        "kind": args.kind,
        "build": build,
        "search": search_kw,
        "k": args.k,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

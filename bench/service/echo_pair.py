"""A batch-1 search's latency over loopback against a bare gRPC echo, interleaved call by call.

    python bench/service/echo_pair.py [--n 1000] [--blocks 40]

Starts a node (``python -m simsearch.service.server --threads 1``) with a flat collection of
``--n`` x 64 and the echo (bench/service/echo_server.py, answering with a search's bytes), then
times single calls in blocks of 100, the three callers in a fresh random order each block, so
that every one sees the same machine: the echo; the generated stub's Search (the node's own cost,
no client code); and ``RemoteCollection.search`` (what a user calls). Prints the median and mean
microseconds per call and their ratio to the echo's, and the CPU time per call of the server
process answering (from /proc, over each caller's blocks) and of the calling thread: the wall
times swing with the machine's other tenants, the CPU times much less. Against another
checkout's code: bench/ab/sitecustomize.py.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from bench import start_echo, start_server  # noqa: E402  (bench/service/bench.py)
from simsearch.eval import markdown_table  # noqa: E402
from simsearch.service import convert  # noqa: E402
from simsearch.service.client import connect  # noqa: E402


def process_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the process has used, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--blocks", type=int, default=40)
    a = p.parse_args(argv)
    import grpc

    rng = np.random.default_rng(0)
    x = rng.standard_normal((a.n, 64)).astype(np.float32)
    qs = rng.standard_normal((200, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        node, port = start_server(Path(tmp) / "data", workers=8)
        echo, echo_port = start_echo(Path(tmp), 8)
        try:
            client = connect(f"127.0.0.1:{port}", timeout=60)
            col = client.create_collection("c", 64, "ip", "flat")
            col.add(x)
            channel = grpc.insecure_channel(f"127.0.0.1:{echo_port}")
            echo_call = channel.unary_unary("/echo.Echo/Call")
            answer = a.k * convert.RESULT_BYTES + 16
            echo_req = answer.to_bytes(4, "little") + bytes(64 * 4)
            pb, stub = client._pb, client._stub

            def raw(i):
                return stub.Search(pb.SearchRequest(collection="c", k=a.k,
                                                    queries=convert.to_matrix(qs[i : i + 1])),
                                   timeout=60)

            callers = {
                "bare echo": lambda i: echo_call(echo_req, timeout=60),
                "node, generated stub": raw,
                "node, RemoteCollection.search": lambda i: col.search(qs[i : i + 1], a.k),
            }
            server_of = {"bare echo": echo.pid}
            took: dict[str, list[float]] = {name: [] for name in callers}
            cpu = {name: [0.0, 0.0] for name in callers}  # server, client seconds
            for fn in callers.values():  # warm up channels and caches
                for i in range(300):
                    fn(i % len(qs))
            order = list(callers)
            for _ in range(a.blocks):
                rng.shuffle(order)  # no caller always runs after the same one
                for name in order:
                    fn, out = callers[name], took[name]
                    pid = server_of.get(name, node.pid)
                    s0, c0 = process_cpu(pid), time.thread_time()
                    for i in range(100):
                        t0 = time.perf_counter()
                        fn(i % len(qs))
                        out.append(time.perf_counter() - t0)
                    cpu[name][0] += process_cpu(pid) - s0
                    cpu[name][1] += time.thread_time() - c0
            channel.close()
            client.close()
        finally:
            for proc in (node, echo):
                proc.terminate()
                proc.wait(60)
    med = {name: float(np.median(v)) * 1e6 for name, v in took.items()}
    mean = {name: float(np.mean(v)) * 1e6 for name, v in took.items()}
    rows = [{"call": name, "median µs": med[name],
             "median / echo": f"{med[name] / med['bare echo']:.2f}",
             "mean µs": mean[name], "mean / echo": f"{mean[name] / mean['bare echo']:.2f}",
             "server CPU µs/call": cpu[name][0] / len(took[name]) * 1e6,
             "client CPU µs/call": cpu[name][1] / len(took[name]) * 1e6}
            for name in callers]
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

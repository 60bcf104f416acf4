"""A batch-1 search's latency over loopback against a bare gRPC echo, interleaved call by call.

    python bench/service/echo_pair.py [--n 1000] [--blocks 40] [--rounds 1] [--pin] [--no-halt]
        [--no-retry-callers] [--batch none|node|both]

Starts a node (``python -m simsearch.service.server --threads 1``) with a flat collection of
``--n`` x 64 and the echo (bench/service/echo_server.py, answering with a search's bytes), then
times single calls in blocks of 100, the three callers in a fresh random order each block, so
that every one sees the same machine: the echo; the generated stub's Search (the node's own cost,
no client code); and ``RemoteCollection.search`` (what a user calls). Prints the median and mean
microseconds per call and their ratio to the echo's, and the CPU time per call of the server
process answering (from /proc, over each caller's blocks) and of the calling thread: the wall
times swing with the machine's other tenants, the CPU times much less. ``--rounds R`` starts
the pair afresh R times (the ratio moves by up to 0.15 between rounds with the processes'
placement) and reports the median round. ``--pin`` runs both servers on the last CPU and the
caller on the first (the rounds then usually agree to 0.02). ``--no-halt`` keeps the CPUs out of
idle while timing (root): the echo then times the calls' own work, not mostly wake-ups.
``--batch node|both`` starts the node, or both servers, under SCHED_BATCH (a measurement of
the GIL's hand-offs, not a setting to serve with). ``--no-retry-callers`` adds the echo and
the client on channels without gRPC's retry filter (``grpc.enable_retries`` 0; the client then
sends each call once). Against another checkout's
code: bench/ab/sitecustomize.py.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import struct
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


def one_round(a: argparse.Namespace, seed: int) -> dict[str, dict[str, float]]:
    """One node and one echo, started afresh; per caller: median and mean µs per call, and the
    answering server's and the calling thread's CPU µs per call."""
    import grpc

    rng = np.random.default_rng(seed)
    x = rng.standard_normal((a.n, 64)).astype(np.float32)
    qs = rng.standard_normal((200, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp, pinned(a.pin) as caller_cpu:
        with sched_batch(a.batch in ("node", "both")):
            node, port = start_server(Path(tmp) / "data", workers=8)
        with sched_batch(a.batch == "both"):
            echo, echo_port = start_echo(Path(tmp), 8)
        if caller_cpu is not None:
            os.sched_setaffinity(0, {caller_cpu})
        try:
            client = connect(f"127.0.0.1:{port}", timeout=60)
            col = client.create_collection("c", 64, "ip", "flat")
            col.add(x)
            channel = grpc.insecure_channel(f"127.0.0.1:{echo_port}")
            echo_call = channel.unary_unary("/echo.Echo/Call")
            answer = a.k * convert.RESULT_BYTES + 16
            echo_req = answer.to_bytes(4, "little") + bytes(64 * 4)
            pb, stub = client._pb, client._stub
            if a.no_retry_callers:  # gRPC's retry filter left out of the channel
                off = [("grpc.enable_retries", 0)]
                echo_off = grpc.insecure_channel(f"127.0.0.1:{echo_port}", options=off)
                client_off = connect(f"127.0.0.1:{port}", timeout=60, retries=False)

            def raw(i):
                return stub.Search(pb.SearchRequest(collection="c", k=a.k,
                                                    queries=convert.to_matrix(qs[i : i + 1])),
                                   timeout=60)

            callers = {
                "bare echo": lambda i: echo_call(echo_req, timeout=60),
                "node, generated stub": raw,
                "node, RemoteCollection.search": lambda i: col.search(qs[i : i + 1], a.k),
            }
            if a.no_retry_callers:
                echo_off_call = echo_off.unary_unary("/echo.Echo/Call")
                col_off = client_off.collection("c")
                callers["echo, no retries"] = lambda i: echo_off_call(echo_req, timeout=60)
                callers["client, no retries"] = lambda i: col_off.search(qs[i : i + 1], a.k)
            server_of = {"bare echo": echo.pid, "echo, no retries": echo.pid}
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
            if a.no_retry_callers:
                echo_off.close()
                client_off.close()
        finally:
            for proc in (node, echo):
                proc.terminate()
                proc.wait(60)
    return {name: {"median": float(np.median(v)) * 1e6, "mean": float(np.mean(v)) * 1e6,
                   "server_cpu": cpu[name][0] / len(v) * 1e6,
                   "client_cpu": cpu[name][1] / len(v) * 1e6} for name, v in took.items()}


@contextlib.contextmanager
def pinned(on: bool):
    """With ``on``, the servers started inside run on the last CPU (they inherit it); yields the
    first, for the caller once they have started (else None): the calls' ends stop sharing a
    core's caches by chance, and the rounds usually agree to 0.02 (unpinned, up to 0.2)."""
    if not on:
        yield None
        return
    before = os.sched_getaffinity(0)
    cpus = sorted(before)
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least 2 CPUs")
    os.sched_setaffinity(0, {cpus[-1]})
    try:
        yield cpus[0]
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def sched_batch(on: bool):
    """With ``on``, processes started inside run under SCHED_BATCH (their threads inherit the
    calling thread's policy): a woken thread of theirs waits for the running one instead of
    preempting it (docs/bench/service.md, "Where the pinned gap goes")."""
    if not on:
        yield
        return
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
    try:
        yield
    finally:
        os.sched_setscheduler(0, *before)


@contextlib.contextmanager
def no_halt(on: bool):
    """With ``on``, keep the CPUs out of their idle states while held (PM QoS: 0 µs of wake-up
    latency allowed, root only), so that the echo is not timed mostly waking up."""
    if not on:
        yield
        return
    fd = os.open("/dev/cpu_dma_latency", os.O_WRONLY)
    try:
        os.write(fd, struct.pack("i", 0))
        yield
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--k", type=int, default=10)
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--rounds", type=int, default=1,
                   help="fresh node and echo each round; the summary is the median round")
    p.add_argument("--pin", action="store_true",
                   help="the node and the echo on the last CPU, the caller on the first")
    p.add_argument("--no-retry-callers", action="store_true",
                   help="also the echo and the client on channels without gRPC's retry filter")
    p.add_argument("--batch", choices=("none", "node", "both"), default="none",
                   help="start the node (node) or the node and the echo (both) under SCHED_BATCH")
    p.add_argument("--no-halt", action="store_true",
                   help="keep the CPUs out of idle (/dev/cpu_dma_latency 0) while timing")
    a = p.parse_args(argv)
    rounds = []
    with no_halt(a.no_halt):
        for r in range(a.rounds):
            rounds.append(one_round(a, r))
            if a.rounds > 1:
                echo = rounds[-1]["bare echo"]["median"]
                print(f"round {r + 1}: echo {echo:.0f} µs, " + ", ".join(
                    f"{name} {v['median'] / echo:.2f}" for name, v in rounds[-1].items()
                    if name != "bare echo"), flush=True)
    names = list(rounds[0])
    rows = []
    for name in names:
        ratio = [r[name]["median"] / r["bare echo"]["median"] for r in rounds]
        mean_ratio = [r[name]["mean"] / r["bare echo"]["mean"] for r in rounds]
        mid = int(np.argsort(ratio)[len(ratio) // 2])  # the median round by this ratio
        row = rounds[mid][name]
        rows.append({"call": name, "median µs": row["median"],
                     "median / echo": f"{ratio[mid]:.2f}",
                     "mean µs": row["mean"], "mean / echo": f"{mean_ratio[mid]:.2f}",
                     "server CPU µs/call": row["server_cpu"],
                     "client CPU µs/call": row["client_cpu"]})
        if a.rounds > 1:
            rows[-1]["median / echo, rounds (min-max)"] = f"{min(ratio):.2f}-{max(ratio):.2f}"
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

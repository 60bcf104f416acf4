"""Context switches per batch-1 call in a pinned server, by thread (root: perf and tracefs).

    python bench/service/switches.py [--server node|echo] [--seconds 3] [--batch]

Starts the node (a flat collection of 1,000 x 64, searched one query at a time through the
generated stub) or the echo (bench/service/echo_server.py) on the last CPU, calls it from the
first, and records the scheduler's switch and wake-up events on the server's CPU
(``perf record -e sched:sched_switch -e sched:sched_wakeup -C <cpu>``) while the calls run.
Prints, per call: each thread's switches out and how many of them were preemptions (switched
out while still runnable), who took the CPU from whom, and who woke whom. ``--batch`` starts the
server under SCHED_BATCH (its threads inherit it): a woken thread then waits for the running
one instead of preempting it. Findings: docs/bench/service.md, "Where the pinned gap goes".
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from echo_pair import pinned, sched_batch  # noqa: E402

from bench import start_echo, start_server  # noqa: E402  (bench/service/bench.py)
from simsearch.service import convert  # noqa: E402
from simsearch.service.client import connect  # noqa: E402

_SWITCH = re.compile(r"\] +([\d.]+): sched:sched_switch: prev_comm=(\S+) prev_pid=(\d+) .*"
                     r"prev_state=(\S+) ==> next_comm=(\S+) next_pid=(\d+)")
_WAKE = re.compile(r"^\s*(\S+)\s+(\d+) .*sched:sched_wakeup: comm=(\S+) pid=(\d+)")


def drive(server: str, seconds: float, batch: bool, trace: Path) -> float:
    """Calls the pinned server for ``seconds`` while perf records its CPU; returns calls per
    second over the recording."""
    import grpc

    rng = np.random.default_rng(0)
    x = rng.standard_normal((1000, 64)).astype(np.float32)
    qs = rng.standard_normal((200, 64)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp, pinned(True) as caller_cpu:
        with sched_batch(batch):
            if server == "node":
                proc, port = start_server(Path(tmp) / "data", workers=8)
            else:
                proc, port = start_echo(Path(tmp), 8)
        server_cpu = max(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {caller_cpu})
        try:
            if server == "node":
                client = connect(f"127.0.0.1:{port}", timeout=60)
                col = client.create_collection("c", 64, "ip", "flat")
                col.add(x)
                pb, stub = client._pb, client._stub

                def call(i):
                    req = pb.SearchRequest(collection="c", k=10)
                    convert.put_matrix(req.queries, qs[i : i + 1])
                    stub.Search(req, timeout=60)
            else:
                echo = grpc.insecure_channel(f"127.0.0.1:{port}").unary_unary("/echo.Echo/Call")
                req = (10 * convert.RESULT_BYTES + 16).to_bytes(4, "little") + bytes(64 * 4)

                def call(i):
                    echo(req, timeout=60)
            for i in range(2000):  # warm up
                call(i % len(qs))
            perf = subprocess.Popen(["perf", "record", "-q", "-e", "sched:sched_switch",
                                     "-e", "sched:sched_wakeup", "-C", str(server_cpu),
                                     "-o", str(trace), "--", "sleep", str(seconds)],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(0.5)  # perf is recording before the first timed call
            n, t0 = 0, time.perf_counter()
            while perf.poll() is None:
                call(n % len(qs))
                n += 1
            return n / (time.perf_counter() - t0)
        finally:
            proc.terminate()
            proc.wait(60)


def summarize(trace: Path, calls_per_s: float, top: int = 8) -> None:
    text = subprocess.run(["perf", "script", "-i", str(trace)], capture_output=True,
                          text=True, check=True).stdout
    out, preempted, took, woke = (collections.Counter() for _ in range(4))
    first = last = None
    for line in text.splitlines():
        if m := _SWITCH.search(line):
            t = float(m.group(1))
            first, last = first or t, t
            who, by = f"{m.group(2)}:{m.group(3)}", f"{m.group(5)}:{m.group(6)}"
            out[who] += 1
            if m.group(4).startswith("R"):
                preempted[who] += 1
                took[(by, who)] += 1
        elif m := _WAKE.search(line):
            woke[(f"{m.group(1)}:{m.group(2)}", f"{m.group(3)}:{m.group(4)}")] += 1
    calls = (last - first) * calls_per_s
    print(f"{calls:.0f} calls, {1e6 / calls_per_s:.0f} µs each; per call: "
          f"{sum(out.values()) / calls:.2f} switches, {sum(preempted.values()) / calls:.2f} "
          "of them preemptions")
    print("thread (comm:tid): switched out / preempted, per call")
    for who, v in out.most_common(top):
        print(f"  {who:24s} {v / calls:5.2f} / {preempted[who] / calls:5.2f}")
    print("preempted by (taker <- taken), per call")
    for (by, who), v in took.most_common(top):
        print(f"  {by} <- {who}: {v / calls:.2f}")
    print("wake-ups (waker -> woken), per call")
    for (a, b), v in woke.most_common(top):
        print(f"  {a} -> {b}: {v / calls:.2f}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", choices=("node", "echo"), default="node")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--batch", action="store_true", help="the server under SCHED_BATCH")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "sched.data"
        summarize(trace, drive(a.server, a.seconds, a.batch, trace))
    return 0


if __name__ == "__main__":
    sys.exit(main())

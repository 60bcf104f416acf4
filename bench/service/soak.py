"""A mixed-load soak of one node: searching clients, writing clients, a SIGKILL and restart of the
server in the middle. Reports failed calls, acknowledged writes lost, latency and the server's
resident memory over time (docs/bench/service.md, "Soak").

    python bench/service/soak.py --minutes 10 --kind hnsw --plot docs/img/soak-hnsw.png

Writers own disjoint id ranges and write batches with explicit ids as upserts, retrying a batch
until it is acknowledged (so a retry after the kill is idempotent); each also removes its oldest
batches beyond a window, so the collection keeps a steady size and memory that grows is growth per
request, not data. After the run every acknowledged, not removed id must be stored: ``remove`` of
exactly those ids must succeed (it refuses unknown ids) and leave the collection empty.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simsearch.service.client import connect

DIM = 32
BATCH = 50
ID_SPACE = 1 << 40  # writer w owns ids [w * ID_SPACE, (w + 1) * ID_SPACE)
RECONNECT_S = 10.0


def vectors_of(ids: np.ndarray) -> np.ndarray:
    """The vector of an id, the same every time (writers and the final check agree)."""
    out = np.empty((ids.size, DIM), np.float32)
    for r, i in enumerate(ids.tolist()):
        out[r] = np.random.default_rng(i).standard_normal(DIM, dtype=np.float32)
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """``python -m simsearch.service.server`` on a fixed port, so a restart keeps the address."""

    def __init__(self, data_dir: Path, port: int):
        self.data_dir, self.port = data_dir, port
        self.proc: subprocess.Popen | None = None
        self.log = open(data_dir.parent / "server.log", "ab")

    def start(self, timeout: float = 600.0) -> None:
        ready = self.data_dir.parent / "ready.json"
        ready.unlink(missing_ok=True)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "simsearch.service.server", "--data-dir", str(self.data_dir),
             "--port", str(self.port), "--ready-file", str(ready), "--threads", "1",
             "--log-level", "WARNING"],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
        t0 = time.monotonic()
        while not ready.exists():
            if self.proc.poll() is not None or time.monotonic() - t0 > timeout:
                raise RuntimeError(f"server did not start (exit {self.proc.poll()})")
            time.sleep(0.05)

    def rss_mib(self) -> float | None:
        try:
            with open(f"/proc/{self.proc.pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            return None
        return None

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


class ClusterTarget:
    """A local Pyramid cluster (3 shards, 2 replicas of each part); the disruption SIGKILLs
    shard 0, which its supervisor restarts and the coordinator catches up."""

    def __init__(self, work: Path):
        from simsearch.pyramid.launcher import LocalCluster

        self.cluster = LocalCluster(work / "cluster", 3, 2)
        self.address = self.cluster.coordinator

    def rss_mib(self) -> float | None:
        total = 0.0
        for pid in [i["pid"] for i in self.cluster.up["processes"].values()]:
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next(int(ln.split()[1]) for ln in f if ln.startswith("VmRSS:"))
            except (OSError, StopIteration):
                pass
        return total / 1024 or None

    def disrupt(self) -> None:
        self.cluster.signal_shard(0, signal.SIGKILL)

    def stop(self) -> None:
        self.cluster.stop()


class NodeTarget:
    """One node; the disruption SIGKILLs it and starts it again on the same data and port."""

    def __init__(self, work: Path):
        self.server = Server(work / "data", free_port())
        self.server.start()
        self.address = f"127.0.0.1:{self.server.port}"

    def rss_mib(self) -> float | None:
        return self.server.rss_mib()

    def disrupt(self) -> None:
        self.server.kill()
        self.server.start()

    def stop(self) -> None:
        self.server.stop()


@dataclass
class Series:
    """Per-second samples: searches, writes, latencies (s) and RSS (MiB)."""

    lat: dict[int, list[float]] = field(default_factory=dict)
    writes: dict[int, int] = field(default_factory=dict)
    fails: dict[int, int] = field(default_factory=dict)
    rss: dict[int, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def search(self, sec: int, seconds: float) -> None:
        with self.lock:
            self.lat.setdefault(sec, []).append(seconds)

    def write(self, sec: int) -> None:
        with self.lock:
            self.writes[sec] = self.writes.get(sec, 0) + 1

    def fail(self, sec: int) -> None:
        with self.lock:
            self.fails[sec] = self.fails.get(sec, 0) + 1


def run(args: argparse.Namespace) -> dict:
    work = Path(tempfile.mkdtemp(prefix="simsearch-soak-"))
    target = ClusterTarget(work) if args.kind == "pyramid" else NodeTarget(work)
    address = target.address
    params = {
        "hnsw": {"M": 16, "ef_construction": 64},
        "pyramid": {"n_centers": 64, "n_partitions": 3, "mips_replicas": 0, "sub_index": "hnsw",
                    "M": 16, "ef_construction": 64},
    }.get(args.kind, {})
    col = connect(address, timeout=120).create_collection("soak", DIM, "l2", args.kind, **params)
    if col.needs_training:
        col.train(vectors_of(np.arange(-5000, 0, dtype=np.int64) + (1 << 62)))
    search_kw = {"hnsw": {"ef": 64}, "pyramid": {"branching": 8, "ef": 64}}.get(args.kind, {})
    total = args.minutes * 60
    kill_at = total * args.kill_at
    t0 = time.monotonic()
    series = Series()
    stop = threading.Event()
    down = [None, None]  # the restart window (seconds since start)
    acked: list[list[int]] = [[] for _ in range(args.writers)]  # live acknowledged ids, in order
    errors: list[str] = []

    def now() -> float:
        return time.monotonic() - t0

    def in_window(t: float) -> bool:
        # from the kill until RECONNECT_S after the server is ready again: a client's channel
        # waits out grpc's reconnect backoff (about 1 s, growing while the server was down)
        return down[0] is not None and down[0] - 0.5 <= t <= (down[1] or 1e18) + RECONNECT_S

    def searcher(s: int) -> None:
        rng = np.random.default_rng(1000 + s)
        col = connect(address, timeout=10).collection("soak")
        while not stop.is_set():
            q = rng.standard_normal((int(rng.integers(1, 11)), DIM), dtype=np.float32)
            t = now()
            try:
                col.search(q, 10, **search_kw)
                series.search(int(t), now() - t)
            except Exception as exc:
                series.fail(int(t))
                if not in_window(t):
                    errors.append(f"search at {t:.1f}s: {type(exc).__name__}: {exc}")
                time.sleep(0.05)

    def until_done(call, what: str) -> bool:
        """Call until it succeeds (False: stopped first); failures are counted, and reported
        as errors outside the restart window."""
        while not stop.is_set():
            t = now()
            try:
                call()
                return True
            except Exception as exc:
                series.fail(int(t))
                if not in_window(t):
                    errors.append(f"{what} at {t:.1f}s: {type(exc).__name__}: {exc}")
                time.sleep(0.1)
        return False

    def writer(w: int) -> None:
        col = connect(address, timeout=10).collection("soak")
        nxt = w * ID_SPACE
        live = acked[w]
        pause = 1.0 / args.write_rate
        while not stop.is_set():
            ids = np.arange(nxt, nxt + BATCH, dtype=np.int64)
            x = vectors_of(ids)
            t = now()
            # an upsert is idempotent: retried until acknowledged
            if not until_done(lambda x=x, ids=ids: col.add(x, ids, upsert=True), "add"):
                return  # stopped before the ack: the batch is not counted as acknowledged
            live.extend(ids.tolist())
            series.write(int(t))
            nxt += BATCH
            while len(live) > args.window:
                old = np.array(live[:BATCH], np.int64)
                # a retried remove may find them gone already
                if not until_done(lambda old=old: col.remove(old, missing_ok=True), "remove"):
                    return
                del live[:BATCH]
            time.sleep(pause)

    threads = [threading.Thread(target=searcher, args=(s,)) for s in range(args.searchers)]
    threads += [threading.Thread(target=writer, args=(w,)) for w in range(args.writers)]
    for t in threads:
        t.start()
    killed = False
    last = -1
    try:
        while now() < total:
            sec = int(now())
            if sec != last:
                rss = target.rss_mib()
                if rss is not None:
                    series.rss[sec] = rss
                last = sec
                if args.progress and sec % 10 == 0:
                    n = sum(len(v) for v in series.lat.values())
                    print(f"[soak] {sec:5d}/{int(total)} s  searches {n}  "
                          f"rss {rss or 0:.0f} MiB", file=sys.stderr, flush=True)
            if not killed and now() >= kill_at:
                down[0] = now()
                target.disrupt()
                down[1] = now()
                killed = True
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(60)

    # every acknowledged, not removed id is stored: removing exactly them succeeds
    col = connect(address, timeout=120).collection("soak")
    expected = np.array(sorted(i for live in acked for i in live), np.int64)
    stored = len(col)
    lost = None
    try:
        removed = col.remove(expected)
        lost = int(expected.size - removed) + len(col)
    except Exception as exc:  # an acknowledged id is missing
        errors.append(f"final check: {type(exc).__name__}: {exc}")
        lost = -1
    target.stop()
    secs = sorted(series.lat)
    p50 = {s: float(np.percentile(series.lat[s], 50)) for s in secs}
    p99 = {s: float(np.percentile(series.lat[s], 99)) for s in secs}
    all_ms = [v * 1e3 for s in secs for v in series.lat[s]]
    rss = series.rss
    n_rss = len(rss)
    first_half = [v for s, v in rss.items() if total * 0.1 <= s < kill_at]
    second_half = [v for s, v in rss.items() if s >= kill_at + 0.1 * total]
    return {
        "kind": args.kind,
        "seconds": total,
        "searchers": args.searchers,
        "writers": args.writers,
        "searches": int(sum(len(v) for v in series.lat.values())),
        "writes_acked": int(sum(series.writes.values())),
        "failed_calls": int(sum(series.fails.values())),
        "failed_outside_restart": len(errors) - (1 if lost == -1 else 0),
        "errors": errors[:20],
        "restart_window_s": [down[0], down[1]],
        "acked_live": int(expected.size),
        "stored_before_check": stored,
        "acked_lost": lost,
        "p50_ms": float(np.percentile(all_ms, 50)) if secs else None,
        "p99_ms": float(np.percentile(all_ms, 99)) if secs else None,
        "rss_mib_start": float(np.median(first_half[: max(1, len(first_half) // 5)]))
        if first_half else None,
        "rss_mib_before_kill": float(np.median(first_half[-max(1, len(first_half) // 5):]))
        if first_half else None,
        "rss_mib_end": float(np.median(second_half[-max(1, len(second_half) // 5):]))
        if second_half else None,
        "series": {"sec": secs, "qps": [len(series.lat[s]) for s in secs],
                   "p50_ms": [p50[s] * 1e3 for s in secs], "p99_ms": [p99[s] * 1e3 for s in secs],
                   "rss_sec": sorted(rss), "rss_mib": [rss[s] for s in sorted(rss)],
                   "samples": n_rss},
    }


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    s = report["series"]
    fig, ax = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    ax[0].plot(s["sec"], s["qps"], lw=0.8)
    ax[0].set_ylabel("searches / s")
    ax[1].plot(s["sec"], s["p50_ms"], lw=0.8, label="p50")
    ax[1].plot(s["sec"], s["p99_ms"], lw=0.8, label="p99")
    ax[1].set_yscale("log")
    ax[1].set_ylabel("latency (ms)")
    ax[1].legend()
    ax[2].plot(s["rss_sec"], s["rss_mib"], lw=0.8)
    ax[2].set_ylabel("server RSS (MiB, all processes)")
    ax[2].set_xlabel("seconds")
    a, b = report["restart_window_s"]
    for x in ax:
        if a is not None:
            x.axvspan(a, b, color="red", alpha=0.2)
    what = "shard 0 SIGKILL" if report["kind"] == "pyramid" else "SIGKILL + restart"
    fig.suptitle(f"soak: {report['kind']}, {report['searchers']} searchers, "
                 f"{report['writers']} writers, {what} (red)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--kind", default="hnsw", choices=["hnsw", "flat", "pyramid"],
                   help="pyramid: a local cluster (3 shards x 2 replicas), shard 0 is killed")
    p.add_argument("--searchers", type=int, default=4)
    p.add_argument("--writers", type=int, default=2)
    p.add_argument("--write-rate", type=float, default=20.0, help="batches / s per writer")
    p.add_argument("--window", type=int, default=20_000, help="live ids per writer")
    p.add_argument("--kill-at", type=float, default=0.5, help="fraction of the run")
    p.add_argument("--json", type=Path, help="write the report here")
    p.add_argument("--plot", type=Path, help="write the PNG here")
    p.add_argument("--no-progress", dest="progress", action="store_false")
    args = p.parse_args(argv)
    report = run(args)
    if args.json:
        args.json.write_text(json.dumps(report))
    if args.plot:
        plot(report, args.plot)
    keys = ["kind", "seconds", "searches", "writes_acked", "failed_calls",
            "failed_outside_restart", "acked_live", "acked_lost", "p50_ms", "p99_ms",
            "rss_mib_start", "rss_mib_before_kill", "rss_mib_end"]
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    print("| " + " | ".join(
        f"{report[k]:.2f}" if isinstance(report[k], float) else str(report[k]) for k in keys
    ) + " |")
    for e in report["errors"]:
        print("error:", e, file=sys.stderr)
    ok = report["acked_lost"] == 0 and report["failed_outside_restart"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())

"""A fixed-rate query stream while shard processes are SIGKILLed, SIGSTOPped and killed during
writes (docs/bench/pyramid.md, "Fault runs")."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.eval import recall_at_k

from .common import RESULTS, Cluster, K, build, data


def stream(col, queries, gt, base, metric, rate, seconds, events, params, baseline):
    """Open loop at ``rate`` q/s; events: [(t, fn)]. Returns per-query records."""
    pool = ThreadPoolExecutor(64)
    recs = []
    lock = threading.Lock()

    def one(i, t_sched):
        t0 = time.monotonic()
        try:
            r = col.search(queries[i], K, **params)
            ok = True
            hit = recall_at_k(r.ids, gt.ids[i : i + 1], K, gt_scores=gt.scores[i : i + 1],
                              queries=queries[i : i + 1], base=base, metric=metric)
        except Exception as exc:  # counted as failed
            ok, hit = False, type(exc).__name__
        with lock:
            recs.append({"t": t_sched, "lat": time.monotonic() - t0, "ok": ok, "recall": hit,
                         "healthy_recall": float(baseline[i])})

    start = time.monotonic()
    ev = sorted(events)
    n = int(rate * seconds)
    for i in range(n):
        t_sched = i / rate
        while ev and ev[0][0] <= t_sched:
            ev.pop(0)[1]()
        delay = start + t_sched - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        pool.submit(one, i % len(queries), t_sched)
    pool.shutdown(wait=True)
    return recs


def summarize(recs, lo, hi):
    sel = [r for r in recs if lo <= r["t"] < hi]
    ok = [r for r in sel if r["ok"]]
    lat = np.array([r["lat"] for r in ok]) * 1000
    return {"queries": len(sel), "failed": len(sel) - len(ok),
            "recall": round(float(np.mean([r["recall"] for r in ok])), 4) if ok else None,
            # the same queries answered by the healthy cluster before any fault
            "healthy_recall": round(float(np.mean([r["healthy_recall"] for r in ok])), 4)
            if ok else None,
            "max_ms": round(float(lat.max()), 1) if ok else None,
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if ok else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if ok else None}


def faults(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    tmp = Path(tempfile.mkdtemp(prefix="pyrfault-"))
    cl = Cluster(tmp, 3, 2, "--restart-delay", "2")
    params = {"branching": 4, "ef": 64}
    out = {"metric": args.metric, "n_base": args.n_base, "rate": args.rate,
           "seconds": args.seconds, "load": os.getloadavg()}
    try:
        _, col = build(cl, base, args.metric, 3, args.n_centers, {"M": 16, "ef_construction": 100})
        T = args.seconds
        healthy = col.search(queries, K, **params)
        baseline = np.array([recall_at_k(healthy.ids[i : i + 1], gt.ids[i : i + 1], K,
                                         gt_scores=gt.scores[i : i + 1],
                                         queries=queries[i : i + 1], base=base,
                                         metric=args.metric) for i in range(len(queries))])
        kill_at = T / 4
        recs_kill = stream(col, queries, gt, base, args.metric, args.rate, T,
                           [(kill_at, lambda: os.kill(cl.pid("shard-0"), signal.SIGKILL))], params,
                           baseline)
        out["sigkill"] = {"before": summarize(recs_kill, 0, kill_at),
                          "after": summarize(recs_kill, kill_at, T)}
        print("sigkill", out["sigkill"], flush=True)
        time.sleep(8)  # let shard 0 rejoin before the next scenario
        stop_pid = cl.pid("shard-1")
        recs_stop = stream(col, queries, gt, base, args.metric, args.rate, T,
                           [(kill_at, lambda: os.kill(stop_pid, signal.SIGSTOP)),
                            (kill_at + 10, lambda: os.kill(stop_pid, signal.SIGCONT))], params,
                           baseline)
        out["sigstop"] = {"healthy": summarize(recs_stop, 0, kill_at),
                          "stopped": summarize(recs_stop, kill_at, kill_at + 10),
                          "after": summarize(recs_stop, kill_at + 10, T)}
        print("sigstop", out["sigstop"], flush=True)
        time.sleep(3)
        # writes: single items, SIGKILL a shard part-way; every acknowledged id must be found
        acked, failed = [], 0
        rng = np.random.default_rng(1)
        t_end = time.monotonic() + 12
        killed = False
        i = 0
        while time.monotonic() < t_end:
            if not killed and time.monotonic() > t_end - 8:
                os.kill(cl.pid("shard-2"), signal.SIGKILL)
                killed = True
            v = base[rng.integers(len(base))] + rng.normal(0, 0.05, 50).astype(np.float32)
            try:
                col.add(v[None], ids=[10_000_000 + i])
                acked.append((10_000_000 + i, v))
            except Exception:
                failed += 1
            i += 1
        time.sleep(8)  # let the shard restart and catch up
        lost = 0
        for id_, v in acked:  # through the coordinator: every part asked, the id in the top 10
            r = col.search(v, 10, branching=args.n_centers, ef=128)
            lost += int(id_ not in r.ids[0])
        status = subprocess.run([sys.executable, "-m", "simsearch.pyramid.cli", "status",
                                 "--data-dir", str(tmp)], capture_output=True, text=True)
        out["status_after"] = status.stdout
        print(status.stdout)
        # on the shards themselves: every acknowledged id on every replica of its part (cosine:
        # no MIPS copies, so each id must be found exactly `replicas` times)
        ack_ids = np.array([i for i, _ in acked], np.int64)
        per_replica = {}
        for a in cl.shard_addresses:
            c = ss.connect(a, timeout=60)
            for name in c.list_collections():
                per_replica[f"{a}/{name}"] = c.collection(name).remove(ack_ids, missing_ok=True)
        out["writes_sigkill"] = {"acked": len(acked), "failed_writes": failed,
                                 "not_found_via_coordinator": lost, "count_after": len(col),
                                 "acked_ids_found_per_replica": per_replica,
                                 "replica_copies_found": int(sum(per_replica.values())),
                                 "replica_copies_expected": 2 * len(acked)}
        print("writes", out["writes_sigkill"], flush=True)
    finally:
        cl.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"pyramid_faults_{args.metric}.json").write_text(json.dumps(
        {**out, "recs_kill": recs_kill, "recs_stop": recs_stop}, default=str))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, recs, title, marks in (
        (axes[0], recs_kill, "SIGKILL shard 0", [kill_at]),
        (axes[1], recs_stop, "SIGSTOP shard 1 (10 s)", [kill_at, kill_at + 10]),
    ):
        done = np.array([r["t"] + r["lat"] for r in recs if r["ok"]])
        bad = np.array([r["t"] for r in recs if not r["ok"]])
        bins = np.arange(0, args.seconds + 2, 1.0)
        ax.plot(bins[:-1], np.histogram(done, bins)[0], label="answered / s")
        if bad.size:
            ax.plot(bins[:-1], np.histogram(bad, bins)[0], label="failed / s")
        lat = [(r["t"], r["lat"] * 1000) for r in recs if r["ok"]]
        ax2 = ax.twinx()
        ax2.scatter(*zip(*lat, strict=True), s=2, c="gray", alpha=0.4)
        ax2.set_ylabel("latency ms (dots)")
        ax2.set_yscale("log")
        for m in marks:
            ax.axvline(m, color="red", ls="--")
        ax.set_title(title)
        ax.set_xlabel("s")
        ax.legend(loc="lower left")
    fig.tight_layout()
    Path("docs/img").mkdir(parents=True, exist_ok=True)
    fig.savefig(f"docs/img/pyramid_faults_{args.metric}.png", dpi=80)



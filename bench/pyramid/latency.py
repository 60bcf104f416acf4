"""Search latency on the leader while it writes and moves replicas (docs/bench/pyramid.md).

    python -m bench.pyramid.latency --n-base 100000 --seconds 10

A local cluster (one coordinator, the leader; ``--shards`` shard servers, 2 replicas) holding
``--n-base`` synthetic 50-d cosine items in HNSW parts. One closed-loop client searches through
the leader (one query per call) in three phases of ``--seconds`` each:

1. quiet: nothing else runs;
2. write burst elsewhere: the same writes go to another collection on the same processes (the
   cost of sharing 2 cores with the writes, not of waiting on them);
3. write burst: a second client upserts batches of ``--write-batch`` items back to back into the
   searched collection, through the same leader (its write throughput is reported too), back
   to back or at ``--write-rate`` items/s;
4. replica move: one more shard starts and the leader moves replicas onto it (copy, switch,
   drop) while the searches run; the phase lasts until the moves are done (at least
   ``--seconds``).

Reports p50 / p99 / mean search latency per phase and each phase's p99 over the quiet one. Raw
latencies to bench/results/pyramid_latency_<tag>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import synthetic_longtail
from simsearch.pyramid.launcher import LocalCluster

RESULTS = Path("bench/results")
DIM = 50


def searcher(col, queries, stop: threading.Event, out: list, params: dict) -> None:
    i = 0
    while not stop.is_set():
        q = queries[i % len(queries)][None]
        t0 = time.monotonic()
        col.search(q, 10, **params)
        out.append((t0, time.monotonic() - t0))
        i += 1


def writer(col, base, batch: int, stop: threading.Event, done: list, rate: float = 0.0) -> None:
    """Upserts of ``batch`` random stored items, back to back, or at ``rate`` items/s."""
    rng = np.random.default_rng(1)
    t_next = time.monotonic()
    while not stop.is_set():
        ids = rng.choice(len(base), batch, replace=False)
        col.add(base[ids], ids=ids, upsert=True)
        done.append((time.monotonic(), batch))
        if rate:
            t_next += batch / rate
            stop.wait(max(0.0, t_next - time.monotonic()))


def phase(col, queries, seconds: float, params: dict, during=None) -> list:
    stop, lat = threading.Event(), []
    th = threading.Thread(target=searcher, args=(col, queries, stop, lat, params))
    th.start()
    try:
        if during is None:
            time.sleep(seconds)
        else:
            during()
    finally:
        stop.set()
        th.join()
    return lat


def stats(lat: list) -> dict:
    ms = np.array([d for _, d in lat]) * 1000
    return {"n": int(ms.size), "p50_ms": float(np.percentile(ms, 50)),
            "p99_ms": float(np.percentile(ms, 99)), "mean_ms": float(ms.mean())}


def shard_replicas(cl: LocalCluster) -> dict[int, int]:
    return {p["id"]: len(p["parts"]) for p in cl.status()["processes"] if p["role"] == "shard"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-base", type=int, default=100_000)
    ap.add_argument("--n-centers", type=int, default=256)
    ap.add_argument("--shards", type=int, default=3)
    ap.add_argument("--parts", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--write-batch", type=int, default=100)
    ap.add_argument("--write-rate", type=float, default=0.0,
                    help="items/s the writer sends (0: back to back)")
    ap.add_argument("--branching", type=int, default=8)
    ap.add_argument("--ef", type=int, default=48)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    base, queries = synthetic_longtail(n=args.n_base, dim=DIM, n_queries=500, seed=3)
    params = {"branching": args.branching, "ef": args.ef}
    out: dict = {"args": vars(args)}
    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(Path(tmp) / "cl", args.shards, 2) as cl:
        client = ss.connect(cl.coordinator, timeout=600)
        col = client.create_collection("docs", DIM, "cosine", "pyramid",
                                       n_centers=args.n_centers, n_partitions=args.parts,
                                       sub_index="hnsw", M=16, ef_construction=100)
        other = client.create_collection("other", DIM, "cosine", "pyramid",
                                         n_centers=args.n_centers, n_partitions=args.parts,
                                         sub_index="hnsw", M=16, ef_construction=100)
        for c in (col, other):
            c.train(base[: min(len(base), 100 * args.n_centers)])
            for s in range(0, len(base), 20_000):
                c.add(base[s : s + 20_000], ids=np.arange(s, min(len(base), s + 20_000)))
        phase(col, queries, 2.0, params)  # warm up
        print("quiet ...", flush=True)
        lat = {"quiet": phase(col, queries, args.seconds, params)}

        def burst(target, wrote):
            stop = threading.Event()
            th = threading.Thread(target=writer, args=(target, base, args.write_batch, stop,
                                                       wrote, args.write_rate))
            th.start()
            time.sleep(args.seconds)
            stop.set()
            th.join()

        for name, target in (("write burst elsewhere", other), ("write burst", col)):
            print(f"{name} ...", flush=True)
            wrote: list = []
            t0 = time.monotonic()
            lat[name] = phase(col, queries, args.seconds, params,
                              lambda t=target, w=wrote: burst(t, w))
            out[f"{name}: items/s"] = sum(n for _, n in wrote) / (time.monotonic() - t0)

        def move():
            before = shard_replicas(cl)
            os.kill(cl.up["supervisor"], signal.SIGUSR1)  # `cluster add-shard`
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                now = shard_replicas(cl)
                new = set(now) - set(before)
                if new and now[new.pop()] >= sum(before.values()) // (len(before) + 1):
                    break
                time.sleep(0.1)
            out["move_seconds"] = time.monotonic() - t0
            time.sleep(max(0.0, args.seconds - out["move_seconds"]))

        print("replica move ...", flush=True)
        lat["replica move"] = phase(col, queries, args.seconds, params, move)
        client.close()
    out["phases"] = {k: stats(v) for k, v in lat.items()}
    quiet = out["phases"]["quiet"]["p99_ms"]
    print(f"\nwrites: {out['write burst: items/s']:.0f} items/s (elsewhere: "
          f"{out['write burst elsewhere: items/s']:.0f}); moves took "
          f"{out['move_seconds']:.1f} s\n")
    print("| phase | searches | p50 ms | p99 ms | mean ms | p99 / quiet |")
    print("|---|---|---|---|---|---|")
    for k, s in out["phases"].items():
        print(f"| {k} | {s['n']} | {s['p50_ms']:.2f} | {s['p99_ms']:.2f} | {s['mean_ms']:.2f} | "
              f"{s['p99_ms'] / quiet:.2f}x |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out["raw"] = {k: v for k, v in lat.items()}
    path = RESULTS / f"pyramid_latency{'_' + args.tag if args.tag else ''}.json"
    path.write_text(json.dumps(out))
    print(f"\nraw: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

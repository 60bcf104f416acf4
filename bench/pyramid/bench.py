"""Pyramid cluster benchmarks (docs/bench/pyramid.md) over real local processes.

    python -m bench.pyramid.bench sweep  --metric cosine --n-base 100000 --shards 4
    python -m bench.pyramid.bench faults --metric cosine --n-base 20000

sweep: recall@10 and throughput against the branching factor K through a coordinator, beside the
naive scheme (random sharding, every query to every shard, fanned out by the client) on the same
shard processes. Throughput: closed loop, ``--clients`` threads sending one query at a time for
``--seconds`` per setting; also the CPU time all server processes spent per query.

faults: a fixed-rate query stream (``--rate`` q/s) while (1) a shard server is SIGKILLed (the
supervisor restarts it), (2) one is SIGSTOPped for 10 s, and (3) a shard server is SIGKILLed
during a stream of single-item writes (then every acknowledged id is looked up). Raw JSON under
bench/results/, a throughput-over-time PNG under docs/img/.
"""

from __future__ import annotations

import argparse
import sys

from .process_faults import faults
from .routing import routing
from .sweep import plot, summary, sweep, table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.pyramid.bench")
    sub = p.add_subparsers(dest="mode", required=True)
    for name in ("sweep", "faults"):
        s = sub.add_parser(name)
        s.add_argument("--metric", default="cosine", choices=["cosine", "ip", "l2"])
        s.add_argument("--n-base", type=int, default=100_000)
        s.add_argument("--n-queries", type=int, default=500)
        s.add_argument("--n-centers", type=int, default=256)
    s = sub.choices["sweep"]
    s.add_argument("--shards", type=int, default=4)
    s.add_argument("--branching", type=int, nargs="+", default=[1, 2, 4, 8])
    s.add_argument("--naive-ef", type=int, nargs="+", default=[16, 32, 64])
    s.add_argument("--ef", type=int, nargs="+", default=[32, 64], help="pyramid parts' ef")
    s.add_argument("--clients", type=int, default=8)
    s.add_argument("--seconds", type=float, default=6.0)
    s.add_argument("--batch", type=int, nargs="+", default=[1, 50],
                   help="queries per call (1: per-call overhead dominates; 50: search work)")
    s.add_argument("--effort", nargs="+", default=["share"], choices=["share", "uniform"],
                   help="pyramid part_effort values")
    s.add_argument("--turns", type=int, default=2,
                   help="turns per setting (each --seconds / turns long, order rotating)")
    s.add_argument("--tag", default="", help="suffix of the result file name")
    s.add_argument("--mips-replicas", type=int, default=300, help="ip: the paper's r")
    s.add_argument("--client-routed", action="store_true",
                   help="also pyramid with the router in the client (no coordinator hop)")
    s.add_argument("--spill", type=float, nargs="+", default=[0.0],
                   help="one pyramid collection per spill ratio (0: no spilled copies)")
    s.add_argument("--coordinator-batches", type=int, nargs="*", default=[],
                   help="per value, every pyramid setting also through one more coordinator "
                        "started with that --search-batches (0: each search alone)")
    s.add_argument("--naive-coordinator", action="store_true",
                   help="also the naive scheme through the coordinator (partition='hash')")
    f = sub.choices["faults"]
    f.add_argument("--rate", type=float, default=40.0)
    f.add_argument("--seconds", type=float, default=40.0)
    r = sub.add_parser("routing")
    r.add_argument("--metric", default="cosine", choices=["cosine", "ip", "l2"])
    r.add_argument("--n-base", type=int, default=200_000)
    r.add_argument("--n-queries", type=int, default=500)
    r.add_argument("--n-centers-list", type=int, nargs="+", default=[512])
    r.add_argument("--parts", type=int, default=8)
    r.add_argument("--branching", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    r.add_argument("--edge-tau", type=float, nargs="+", default=[0.0, 0.1])
    r.add_argument("--spill", type=float, nargs="+", default=[0.0],
                   help="spill ratios (0: none)")
    r.add_argument("--mips-replicas", type=int, default=300, help="ip: the paper's r")
    t = sub.add_parser("table")
    t.add_argument("paths", nargs="+")
    sm = sub.add_parser("summary")
    sm.add_argument("paths", nargs="+")
    sm.add_argument("--min-recall", type=float, default=0.9)
    sm.add_argument("--best", action="store_true", help="the best row per scheme only")
    pl = sub.add_parser("plot")
    pl.add_argument("paths", nargs="+")
    pl.add_argument("--out", default="docs/img/pyramid_sweep.png")
    args = p.parse_args(argv)
    if args.mode == "table":
        table(args.paths)
    elif args.mode == "summary":
        summary(args.paths, args.min_recall, args.best)
    elif args.mode == "plot":
        plot(args.paths, args.out)
    elif args.mode == "routing":
        routing(args)
    else:
        (sweep if args.mode == "sweep" else faults)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""NEQ's 4-bit fast-scan against ScaNN (tree, AH, reorder) as the tail of the norms gets lighter.

    python -m bench.quant.neq_vs_scann [--n 200000] [--sigmas 0.1 0.25 0.5]

synthetic_longtail 200,000 x 64 (1,000 held-out queries, inner product, k = 10) with log-normal
norms of shape sigma: 0.5 is the default long tail (max/median about 9), 0.25 a light one (3),
0.1 almost flat (1.5). Both methods are built and swept exactly as bench/mips/peers_bench.py
builds them (same lists, same (share of lists, re-rank) grid), one thread. At each target the
best setting of each is timed again in turn with the other (best of 5 rounds), and the ratio
comes from those times. Memory is bytes per item of each serialized index.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

import simsearch as ss
from bench.mips.peers_bench import K, methods, sweep
from simsearch.datasets import synthetic_longtail
from simsearch.eval import alternated_best_times, markdown_table, thread_limit

NEQ, SCANN = "simsearch NEQ fast-scan", "ScaNN (tree, AH, reorder)"


def run(n: int, sigma: float, targets: list[float]) -> list[dict]:
    base, queries = synthetic_longtail(n=n, dim=64, n_queries=1000, norm_sigma=sigma, seed=0)
    norms = np.linalg.norm(base, axis=1)
    flat = ss.FlatIndex(64, "ip")
    flat.add(base)
    truth = flat.search(queries, K)
    gt = (truth.ids, truth.scores)
    found, searches = {}, {}
    for label, build, values in methods(64, n):
        if label not in (NEQ, SCANN):
            continue
        search = build(base)
        with thread_limit(1):
            found[label] = sweep(search, values, queries, gt, base)
        searches[label] = search
        print(f"[neq-vs-scann] sigma {sigma}: {label} swept", file=sys.stderr, flush=True)
    rows = []
    for target in targets:
        best = {}
        for label, sw in found.items():
            ok = [p for p in sw if p[1] >= target]
            best[label] = max(ok, key=lambda p: p[2]) if ok else None
        if None in best.values():
            continue
        with thread_limit(1):
            times = alternated_best_times(
                [lambda lb=lb, v=best[lb][0]: searches[lb](queries, v) for lb in (NEQ, SCANN)],
                rounds=5, min_seconds=0.2)
        qps = {lb: len(queries) / t for lb, t in zip((NEQ, SCANN), times, strict=True)}
        rows.append({
            "sigma": sigma, "max/median norm": round(float(norms.max() / np.median(norms)), 1),
            "target": target,
            "NEQ (lists, re-rank)": str(best[NEQ][0]), "NEQ recall": best[NEQ][1],
            "NEQ q/s": qps[NEQ],
            "ScaNN (leaves, reorder)": str(best[SCANN][0]), "ScaNN recall": best[SCANN][1],
            "ScaNN q/s": qps[SCANN], "NEQ / ScaNN": qps[NEQ] / qps[SCANN],
            "NEQ bytes/item": searches[NEQ].memory() / n,
            "ScaNN bytes/item": searches[SCANN].memory() / n,
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200_000)
    p.add_argument("--sigmas", type=float, nargs="+", default=[0.1, 0.25, 0.5])
    p.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95])
    args = p.parse_args(argv)
    rows = [r for s in args.sigmas for r in run(args.n, s, args.targets)]
    print(markdown_table(rows, list(rows[0])))
    return 0


if __name__ == "__main__":
    sys.exit(main())

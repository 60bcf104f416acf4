"""Exact search: simsearch FlatIndex against faiss IndexFlatIP, one thread, same process.

    python -m bench.diagnostics.flat_vs_faiss [--n-base 200000]
"""

from __future__ import annotations

import argparse

import faiss
import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import best_time, markdown_table, thread_limit


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n-base", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    ds = load("glove-50", n_base=args.n_base)
    rows = []
    for metric in ("ip", "cosine"):
        ours = ss.FlatIndex(ds.base.shape[1], metric)
        ours.add(ds.base)
        unit = metric == "cosine"

        def norm(x, unit=unit):
            return x / np.linalg.norm(x, axis=1, keepdims=True) if unit else x

        peer = faiss.IndexFlatIP(ds.base.shape[1])
        peer.add(np.ascontiguousarray(norm(ds.base), np.float32))
        q = ds.queries

        def faiss_search(q=q, peer=peer, norm=norm):
            return peer.search(np.ascontiguousarray(norm(q), np.float32), 10)

        t_f, t_o = [], []
        with thread_limit(1):
            for _ in range(args.rounds):  # alternate so both see the same machine noise
                t_f.append(best_time(faiss_search, 1))
                t_o.append(best_time(lambda q=q, ours=ours: ours.search(q, 10), 1))
        same = (faiss_search()[1] == ours.search(q, 10).ids).mean()
        rows.append({"metric": metric, "faiss q/s": len(q) / min(t_f),
                     "simsearch q/s": len(q) / min(t_o), "ratio": min(t_f) / min(t_o),
                     "same ids": float(same)})
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

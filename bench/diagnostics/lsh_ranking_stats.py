"""Why the plain NR-LSH score fails and the shifted one works, in numbers: for every true top-10
item of every query, its range j, its Hamming distance h to the query code, and how many items a
ranking probes before reaching its (range, h) pair (the whole pair counted as probed first, so
this is the budget T that guarantees the item is found).

    python -m bench.diagnostics.lsh_ranking_stats --dataset glove-50 --n-queries 200
"""

from __future__ import annotations

import argparse

import numpy as np

from simsearch.eval import markdown_table
from simsearch.lsh import NormRangingLSH, pair_order
from simsearch.lsh import _kernels as K

from ..lsh.probes import load_dataset


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--dataset", default="glove-50")
    p.add_argument("--n", type=int, default=1_000_000)
    p.add_argument("--n-queries", type=int, default=200)
    p.add_argument("--bits", type=int, default=32)
    a = p.parse_args(argv)
    ds = load_dataset(a)
    base, queries = ds.base, ds.queries
    gi, _ = ds.ground_truth("ip", 100)
    idx = NormRangingLSH(base.shape[1], n_bits=a.bits, n_ranges=32, seed=0)
    idx.add(base)
    st, L = idx._state, idx.n_hash_bits
    H = L + 1
    pos_of = np.empty(len(base), np.int64)
    pos_of[st.ids] = np.arange(len(base))
    orders = {rk: pair_order(st.U, L, rk) for rk in ("plain", "shifted")}
    need = {rk: [] for rk in orders}
    hs, js = [], []
    for qi, q in enumerate(queries):
        qc = np.uint64(K.hash_query(q, idx._projT))
        h = np.unpackbits((st.codes ^ qc).view(np.uint8).reshape(-1, 8), axis=1).sum(
            1, dtype=np.int64
        )
        counts = np.bincount(st.rng.astype(np.int64) * H + h, minlength=idx.n_ranges * H)
        nb = pos_of[gi[qi, :10]]
        pair = st.rng[nb].astype(np.int64) * H + h[nb]
        hs.append(h[nb])
        js.append(st.rng[nb])
        for rk, (pr, ph) in orders.items():
            seq = pr.astype(np.int64) * H + ph
            before = np.cumsum(counts[seq])  # items probed once each pair is finished
            rank = np.empty_like(seq)
            rank[seq] = np.arange(seq.size)
            need[rk].append(before[rank[pair]])
    h, j = np.concatenate(hs), np.concatenate(js)
    n = len(base)
    rows = []
    for rk, v in need.items():
        v = np.concatenate(v)
        neg = h > L / 2
        rows.append({
            "ranking": rk,
            "median T to reach": float(np.median(v)),
            "90th pct": float(np.percentile(v, 90)),
            "T to reach, neighbours with h > L/2": float(np.median(v[neg])) if neg.any() else "",
            "share reached by T = n/10": float((v <= n / 10).mean()),
        })  # fmt: skip
    print(f"{a.dataset} n={n:,}, {a.bits} bits ({L} hash bits, 32 ranges), "
          f"{len(queries)} queries x top-10")  # fmt: skip
    print(f"true top-10: share in the top 4 ranges (largest norms) {np.mean(j >= 28):.3f}; "
          f"share with h > L/2 (negative plain estimate) {np.mean(h > L / 2):.3f}; "
          f"h mean {h.mean():.1f} (L/2 = {L / 2})")  # fmt: skip
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

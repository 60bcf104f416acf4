"""Proteins diagnostics for CNN-ED training (docs/bench/strings.md, "Why proteins falls short").

    python -m bench.diagnostics.strings_diag [--n-queries 100]

1. Neighbour distances: the benchmark queries' true k-th neighbour against a training anchor's
   k-th neighbour, (a) inside a 2,000-string sample (the old default) and (b) among the whole
   base through bigram candidates (the new default, 200 anchors).
2. Recall@1/@10 against T of simple rankings (bigram-count profile L2, CGK, length difference)
   on the first queries, with full edit-distance rows. Single-threaded.
"""

from __future__ import annotations

import argparse

import numpy as np

from simsearch.datasets import load_strings
from simsearch.strings import Alphabet, CGKEncoder, edit_distance_matrix, hamming_search
from simsearch.strings.training import bigram_profiles, pool_neighbours

TS = (1, 10, 100, 1000, 2000, 4000)


def quantiles(name, d, lengths):
    print(f"{name}: edits p10/25/50/75/90 {np.percentile(d, [10, 25, 50, 75, 90]).round(1)}"
          f"  / length {np.percentile(d / lengths, [10, 25, 50, 75, 90]).round(2)}")


def recall(D, cand, k):
    kth = np.sort(D, 1)[:, k - 1 : k]
    out = []
    for T in TS:
        best = np.sort(np.take_along_axis(D, cand[:, :T], 1), 1)[:, : min(k, T)]
        out.append(round(float(((best <= kth).sum(1) / k).mean()), 3))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n-queries", type=int, default=100)
    args = ap.parse_args()
    ds = load_strings("proteins", n_queries=1000, n_base=50_000, max_len=512)
    base, queries = ds.base, ds.queries
    _, gt_d = ds.ground_truth(50)
    ql = np.array([len(s) for s in queries])
    for k in (1, 10):
        quantiles(f"queries, true {k}-th neighbour", gt_d[:, k - 1], ql)
    pool = sorted(set(base))
    alphabet = Alphabet.from_strings(pool + queries)
    codes, lengths = alphabet.encode(pool, 512)
    rng = np.random.default_rng(0)
    sample = [pool[i] for i in np.sort(rng.choice(len(pool), 2000, replace=False))[:400]]
    sd = edit_distance_matrix(sample, [pool[i] for i in np.sort(
        np.random.default_rng(0).choice(len(pool), 2000, replace=False))])
    sd = np.sort(np.where(sd == 0, np.iinfo(np.int32).max, sd), 1)  # drop self
    sl = np.array([len(s) for s in sample])
    anchors = np.sort(rng.choice(len(pool), 200, replace=False))
    nb = pool_neighbours(pool, codes, lengths, len(alphabet), anchors, 100, 500,
                         n_mean_pairs=2000, progress=False)
    for k in (1, 10):
        quantiles(f"2,000-sample anchors, {k}-th neighbour", sd[:, k - 1], sl)
        quantiles(f"whole-base anchors, {k}-th neighbour", nb.dists[:, k - 1], lengths[anchors])

    q = queries[: args.n_queries]
    D = edit_distance_matrix(q, base).astype(np.int64)
    cb, lb = alphabet.encode(base, 512)
    cq, lq = alphabet.encode(q, 512)
    pb, pq = bigram_profiles(cb, lb, len(alphabet)), bigram_profiles(cq, lq, len(alphabet))
    d2 = (pq**2).sum(1)[:, None] + (pb**2).sum(1)[None] - 2 * pq @ pb.T
    cgk = CGKEncoder(max_len=512).fit(base + queries)
    rankings = {
        "bigram profile L2": np.argsort(d2, 1, kind="stable")[:, : max(TS)],
        "CGK": hamming_search(cgk.encode(q), cgk.encode(base), max(TS))[0],
        "length difference": np.argsort(np.abs(lq[:, None] - lb[None]), 1, kind="stable")[
            :, : max(TS)],
    }
    print(f"T = {TS}")
    for name, cand in rankings.items():
        print(f"{name}: recall@1 {recall(D, cand, 1)}  recall@10 {recall(D, cand, 10)}")


if __name__ == "__main__":
    main()

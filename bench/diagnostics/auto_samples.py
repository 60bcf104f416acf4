"""What auto_index's promise costs, by the number of sample queries it is given.

    flock /tmp/simsearch-bench.lock python bench/diagnostics/auto_samples.py \
        [--dataset glove-50] [--samples 200 600 1200] [--confidence 0.99] [--target 0.9]

auto tunes its knob until a one-sided 99% prediction bound for the mean recall of new queries
reaches the target (src/simsearch/auto.py), so the recall it lands at sits above the target by
a margin that shrinks with the sample and with the bound's confidence. Per sample size and
confidence: the knob auto chose (its candidates
restricted to the method it picks on this set, to keep the run short; a graph's knob), the
recall of 1,000
scored queries held out of every sample, and q/s (one thread, alternated with the knob that
just reaches the target on the scored queries: the best sweep row a hand-tuner would report).
"""

from __future__ import annotations

import argparse

import numpy as np

from simsearch import auto_index, datasets
from simsearch.auto import CANDIDATES
from simsearch.eval import alternated_best_times, markdown_table, recall_at_k, thread_limit

K = 10
N_SCORED = 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="glove-50")
    ap.add_argument("--n-base", type=int, default=100_000)
    ap.add_argument("--samples", type=int, nargs="+", default=[200, 600, 1200])
    ap.add_argument("--target", type=float, default=0.9)
    ap.add_argument("--confidence", type=float, nargs="+", default=[0.99])
    ap.add_argument("--candidate", default="ipnsw-plus-sq8")
    a = ap.parse_args()
    ds = datasets.load(a.dataset, n_base=a.n_base, n_queries=N_SCORED + max(a.samples))
    gi, gs = ds.ground_truth("ip", k=K)
    perm = np.random.default_rng(0).permutation(len(ds.queries))
    scored, pool = perm[:N_SCORED], perm[N_SCORED:]
    q = np.ascontiguousarray(ds.queries[scored])

    def rec(ids):
        return recall_at_k(ids, gi[scored], K, gt_scores=gs[scored], queries=q, base=ds.base,
                           metric="ip")

    rows, autos = [], []
    for conf in a.confidence:
        for n in a.samples:
            idx = auto_index(ds.base, "ip", target_recall=a.target, k=K,
                             queries=ds.queries[pool[:n]], progress=False, n_eval=n,
                             candidates=[a.candidate], confidence=conf)
            knob = idx.tuned_params
            autos.append(((n, conf), idx, knob, rec(idx.search(q, K).ids)))
            print(f"{n} samples, confidence {conf}: {knob}, held-out recall "
                  f"{autos[-1][3]:.4f}", flush=True)
    cand = CANDIDATES[a.candidate]  # the same build, searched at the best row's knob
    inner = cand.make(ds.base.shape[1], "ip", ds.base)
    inner.add(ds.base)
    best = None
    for ef in range(10, 512, 2):
        r = rec(inner.search(q, K, **{**cand.fixed, cand.knob: ef}).ids)
        if r >= a.target:
            best = (ef, r)
            break
    fns = [lambda i=idx: i.search(q, K) for _, idx, _, _ in autos]
    fns.append(lambda: inner.search(q, K, **{**cand.fixed, cand.knob: best[0]}))
    with thread_limit(1):
        times = alternated_best_times(fns, rounds=5, min_seconds=0.2)
    for ((n, conf), _, knob, r), t in zip(autos, times, strict=False):
        rows.append({"sample queries": n, "confidence": conf, "auto's knob": knob,
                     "held-out recall@10": r,
                     "q/s": len(q) / t, "vs the best row": times[-1] / t})
    rows.append({"sample queries": "best row (tuned on the scored queries)", "confidence": "-",
                 "auto's knob": {cand.knob: best[0]}, "held-out recall@10": best[1],
                 "q/s": len(q) / times[-1], "vs the best row": 1.0})
    print(markdown_table(rows, list(rows[0])))


if __name__ == "__main__":
    main()

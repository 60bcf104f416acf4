"""Routing alone, in process with exact parts: recall against parts asked per query."""

from __future__ import annotations

import json
import time

from simsearch.eval import recall_at_k

from .common import RESULTS, K, data


def routing(args) -> None:
    """In process, exact (flat) parts: recall@10 and parts asked per query against K, so the
    routing alone is measured (no sub-index error, no network)."""
    from simsearch.eval import thread_limit
    from simsearch.pyramid import PyramidIndex

    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    rows = []
    with thread_limit(1):
        for tau, m, spill in [(t, m, s) for t in args.edge_tau for m in args.n_centers_list
                              for s in args.spill]:
            t0 = time.time()
            p = PyramidIndex(50, args.metric, n_centers=m, n_partitions=args.parts,
                             sub_index="flat", edge_tau=tau, spill=spill,
                             mips_replicas=args.mips_replicas)
            p.train(base)
            p.add(base)
            build = time.time() - t0
            for b in args.branching:
                r = p.search(queries, K, branching=b)
                rec = recall_at_k(r.ids, gt.ids, K, gt_scores=gt.scores, queries=queries,
                                  base=base, metric=args.metric)
                row = {"edge_tau": tau, "n_centers": m, "spill": spill, "K": b,
                       "recall": round(rec, 4),
                       "parts_per_query": round(float(p.route(queries, b).sum(1).mean()), 2),
                       "stored_per_item": round(float(p.part_sizes().sum() / len(p)), 3),
                       "build_s": round(build, 1)}
                print(row, flush=True)
                rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    centres = "-".join(map(str, args.n_centers_list))
    name = (f"pyramid_routing_{args.metric}_{args.parts}parts_{args.n_base // 1000}k_{centres}c"
            + (f"_r{args.mips_replicas}" if args.metric == "ip" else "")
            + ("_spill" + "-".join(f"{s:g}" for s in args.spill) if any(args.spill) else "")
            + ".json")
    (RESULTS / name).write_text(json.dumps(
        {"metric": args.metric, "n_base": args.n_base, "parts": args.parts, "rows": rows},
        indent=1))
    print("\n| edge_tau | centres | spill | K | recall@10 (exact parts) | parts asked / query | "
          "items stored / item |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['edge_tau']} | {r['n_centers']} | {r['spill']:g} | {r['K']} | "
              f"{r['recall']:.3f} | {r['parts_per_query']:.2f} | {r['stored_per_item']:.2f} |")



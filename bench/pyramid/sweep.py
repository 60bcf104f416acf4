"""Recall@10 and throughput against the branching factor through a coordinator, beside the naive
scheme; and the tables, summaries and plot of those runs (docs/bench-pyramid.md)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from simsearch.eval import recall_at_k

from .common import RESULTS, Cluster, K, Naive, build, closed_loop, data


def sweep(args) -> None:
    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    sub = {"M": 16, "ef_construction": 100}
    tmp = Path(tempfile.mkdtemp(prefix="pyrbench-"))
    cl = Cluster(tmp, args.shards, 1)  # one replica: both schemes use every process equally
    rows = []
    targets: dict = {}
    try:
        t0 = time.time()
        _, col = build(cl, base, args.metric, args.shards, args.n_centers, sub,
                       args.mips_replicas)
        t_pyr = time.time() - t0
        t0 = time.time()
        naive = Naive(cl.shard_addresses, base, args.metric, sub)
        t_naive = time.time() - t0
        print(f"built: pyramid {t_pyr:.0f}s, naive {t_naive:.0f}s", flush=True)

        def rec(r):
            return recall_at_k(r.ids, gt.ids, K, gt_scores=gt.scores, queries=queries,
                               base=base, metric=args.metric)

        targets.update(pyramid=col, naive=naive)
        settings = [("pyramid", {"branching": b, "ef": e, "part_effort": pe})
                    for pe in args.effort for e in args.ef for b in args.branching]
        if args.client_routed:  # the router copied into this process, asking shards directly
            from simsearch.pyramid.parts import open_router

            targets["pyramid-client"] = open_router(cl.coordinator, "glove", cl.up["etcd"],
                                                     cl.up["cluster"])
            settings += [("pyramid-client", {"branching": b, "ef": e, "part_effort": "uniform"})
                         for e in args.ef for b in args.branching]
        settings += [("naive", {"ef": e}) for e in args.naive_ef]
        for scheme, params in settings:
            target = targets[scheme]
            row = {"scheme": scheme, **params,
                   "recall": round(rec(target.search(queries, K, **params)), 4)}
            if "pyramid-client" in targets and scheme != "naive":
                row["parts_per_query"] = round(float(
                    targets["pyramid-client"].route(queries, params["branching"]).sum(1).mean()),
                    2)
            rows.append(row)
        # throughput: every setting measured in short turns, the turn order rotating, so the
        # schemes alternate under the same background load
        for batch in args.batch:
            acc = [[0, 0.0, {}] for _ in settings]
            n_turns = args.turns
            for turn in range(n_turns):
                order = list(range(len(settings)))
                shift = turn * len(order) // n_turns
                order = order[shift:] + order[:shift]
                if turn % 2:
                    order.reverse()
                for i in order:
                    scheme, params = settings[i]
                    target = targets[scheme]
                    n, wall, cpu = closed_loop(lambda q, t=target, p=params: t.search(q, K, **p),
                                               queries, args.clients, args.seconds / n_turns, cl,
                                               batch)
                    acc[i][0] += n
                    acc[i][1] += wall
                    for r_, v in cpu.items():
                        acc[i][2][r_] = acc[i][2].get(r_, 0.0) + v
            for row, (n, wall, cpu) in zip(rows, acc, strict=True):
                row[f"qps_b{batch}"] = round(n / wall, 1)
                row[f"cpu_ms_b{batch}"] = round(1000 * sum(cpu.values()) / max(1, n), 3)
                row[f"cpu_role_ms_b{batch}"] = {r_: round(1000 * v / max(1, n), 3)
                                                for r_, v in cpu.items()}
            for row in rows:
                print(row, flush=True)
    finally:
        if "pyramid-client" in targets:  # its etcd watches and shard connections
            targets["pyramid-client"].parts[0].pool.close()
        cl.stop()
    out = {"metric": args.metric, "n_base": args.n_base, "n_queries": args.n_queries,
           "shards": args.shards, "n_centers": args.n_centers, "clients": args.clients,
           "seconds": args.seconds, "batch": args.batch, "turns": args.turns,
           "mips_replicas": args.mips_replicas,
           "build_s": {"pyramid": t_pyr, "naive": t_naive},
           "load": os.getloadavg(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"_{args.tag}" if args.tag else ""
    (RESULTS / f"pyramid_sweep_{args.metric}{tag}.json").write_text(json.dumps(out, indent=1))



def table(paths) -> None:
    """Markdown tables from sweep JSON files. Beside each pyramid row: its q/s over the best
    naive q/s among naive rows with recall at least as high ("q/s vs naive"), and the lowest
    naive CPU per query among those rows over its own ("CPU gain")."""
    for path in paths:
        d = json.loads(Path(path).read_text())
        bs = d.get("batch", [1])
        print(f"\n{path}: glove-50 {d['metric']}, {d['n_base']} base, {d['n_queries']} queries, "
              f"{d['shards']} shard processes, {d['n_centers']} centres, {d['clients']} clients, "
              f"load {d['load'][0]:.1f}\n")
        head = ["scheme", "K", "ef", "part effort", "recall@10"]
        for b in bs:
            head += [f"q/s b{b}", f"CPU ms/q b{b}", f"q/s vs naive b{b}", f"CPU gain b{b}"]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        naive = [r for r in d["rows"] if r["scheme"] == "naive"]
        for r in d["rows"]:
            kcell = str(r.get("branching", "all"))
            if "parts_per_query" in r:
                kcell += f" ({r['parts_per_query']:.1f} parts)"
            cells = [r["scheme"], kcell, str(r["ef"]),
                     r.get("part_effort", "uniform") if r["scheme"] != "naive" else "",
                     f"{r['recall']:.3f}"]
            for b in bs:
                peers = [n for n in naive if n["recall"] >= r["recall"]]
                ratio = gain = ""
                if r["scheme"] != "naive" and peers:
                    best = max(n[f"qps_b{b}"] for n in peers)
                    ratio = f"{r[f'qps_b{b}'] / best:.2f}x"
                    cheapest = min(n[f"cpu_ms_b{b}"] for n in peers)
                    gain = f"{cheapest / r[f'cpu_ms_b{b}']:.2f}x"
                cells += [f"{r[f'qps_b{b}']:.0f}", f"{r[f'cpu_ms_b{b}']:.2f}", ratio, gain]
            print("| " + " | ".join(cells) + " |")


def naive_at(naive: list, recall: float, key: str) -> float | None:
    """A naive row's ``key`` linearly interpolated at ``recall`` between the two naive rows
    whose recall brackets it (None outside the naive rows' range)."""
    rs = sorted(naive, key=lambda r: r["recall"])
    x = [r["recall"] for r in rs]
    if not rs or recall < x[0] or recall > x[-1]:
        return None
    return float(np.interp(recall, x, [r[key] for r in rs]))


def summary(paths, min_recall: float = 0.9, best: bool = False) -> None:
    """Per file and batch size: every pyramid row with recall >= min_recall beside the naive
    scheme interpolated to the same recall (q/s ratio and CPU gain); ``best``: only the row
    with the highest q/s ratio per scheme (via the coordinator, client-routed)."""
    print("| data | batch | pyramid (K, ef, effort) | recall@10 | pyramid q/s | naive q/s at "
          "equal recall | q/s ratio | pyramid CPU ms/q | naive CPU ms/q | CPU gain |")
    print("|" + "---|" * 10)
    for path in paths:
        d = json.loads(Path(path).read_text())
        naive = [r for r in d["rows"] if r["scheme"] == "naive"]
        pyr = [r for r in d["rows"] if r["scheme"] != "naive" and r["recall"] >= min_recall]
        name = f"{d['metric']} {d['n_base'] // 1000}k, {d['shards']} shards ({Path(path).stem})"
        for b in d.get("batch", [1]):
            lines = []
            for r in sorted(pyr, key=lambda r: r["recall"]):
                nq = naive_at(naive, r["recall"], f"qps_b{b}")
                nc = naive_at(naive, r["recall"], f"cpu_ms_b{b}")
                if nq is None:
                    continue
                lines.append((r, nq, nc))
            if best:
                lines = [max((t for t in lines if t[0]["scheme"] == sch),
                             key=lambda t: t[0][f"qps_b{b}"] / t[1])
                         for sch in sorted({t[0]["scheme"] for t in lines})]
            for r, nq, nc in lines:
                print(f"| {name} | {b} | {r['scheme']}: K={r['branching']}, ef={r['ef']}, "
                      f"{r.get('part_effort', 'uniform')} | {r['recall']:.3f} | "
                      f"{r[f'qps_b{b}']:.0f} | {nq:.0f} | {r[f'qps_b{b}'] / nq:.2f}x | "
                      f"{r[f'cpu_ms_b{b}']:.2f} | {nc:.2f} | {nc / r[f'cpu_ms_b{b}']:.2f}x |")


def plot(paths, out: str) -> None:
    """Throughput (q/s) and CPU ms per query against recall@10, one column per batch size,
    one row per sweep file; pyramid points labelled with K."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ds = [json.loads(Path(p).read_text()) for p in paths]
    bs = ds[0].get("batch", [1])
    fig, axes = plt.subplots(len(ds), len(bs), figsize=(4.2 * len(bs), 3.3 * len(ds)),
                             squeeze=False)
    for row, d in zip(axes, ds, strict=True):
        groups: dict[str, list] = {}
        for r in d["rows"]:
            name = (f"{r['scheme']} ef={r['ef']} {r.get('part_effort', 'uniform')}"
                    if r["scheme"] != "naive" else "naive")
            groups.setdefault(name, []).append(r)
        for ax, b in zip(row, bs, strict=True):
            for name, rs in groups.items():
                rs = sorted(rs, key=lambda r: r["recall"])
                ax.plot([r["recall"] for r in rs], [r[f"qps_b{b}"] for r in rs], "o-" if
                        name != "naive" else "s--", label=name, ms=4)
                if name != "naive":
                    for r in rs:
                        ax.annotate(f"K={r['branching']}", (r["recall"], r[f"qps_b{b}"]),
                                    fontsize=6, xytext=(2, 2), textcoords="offset points")
            ax.axvline(0.9, color="gray", lw=0.5)
            ax.set_title(f"{d['metric']}, {d['n_base'] // 1000}k, {d['shards']} shards, "
                         f"batch {b}", fontsize=9)
            ax.set_xlabel("recall@10")
            ax.set_ylabel("queries/s")
        row[0].legend(fontsize=6)
    fig.tight_layout()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=55)



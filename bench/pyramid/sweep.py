"""Recall@10 and throughput against the branching factor through a coordinator, beside the naive
scheme; and the tables, summaries and plot of those runs (docs/bench/pyramid.md)."""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.eval import recall_at_k

from .common import RESULTS, Cluster, K, Naive, build, closed_loop, data

#: the schemes every query of which asks every shard: the bench's client asking them itself,
#: and a hash-partitioned collection behind the same coordinator (partition="hash")
BASELINES = ("naive", "naive-coord")


def sweep(args) -> None:
    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    sub = {"M": 16, "ef_construction": 100}
    tmp = Path(tempfile.mkdtemp(prefix="pyrbench-"))
    cl = Cluster(tmp, args.shards, 1)  # one replica: both schemes use every process equally
    rows = []
    targets: dict = {}
    routers: dict = {}
    try:
        t0 = time.time()
        cols = {}
        for spill in args.spill:  # one collection per spill ratio (0: none)
            _, cols[spill] = build(cl, base, args.metric, args.shards, args.n_centers, sub,
                                   args.mips_replicas, name=_name(spill), spill=spill)
        t_pyr = time.time() - t0
        if args.naive_coordinator:  # every part asked, through the coordinator
            _, targets["naive-coord"] = build(cl, base, args.metric, args.shards, args.shards,
                                              sub, 0, name="hashed", partition="hash")
        t0 = time.time()
        naive = Naive(cl.shard_addresses, base, args.metric, sub)
        t_naive = time.time() - t0
        print(f"built: pyramid {t_pyr:.0f}s, naive {t_naive:.0f}s", flush=True)

        def rec(r):
            return recall_at_k(r.ids, gt.ids, K, gt_scores=gt.scores, queries=queries,
                               base=base, metric=args.metric)

        targets["naive"] = naive
        settings = []
        for spill, col in cols.items():
            targets[("pyramid", spill)] = col
            settings += [(("pyramid", spill), {"branching": b, "ef": e, "part_effort": pe})
                         for pe in args.effort for e in args.ef for b in args.branching]
        from simsearch.pyramid.direct import open_router

        routers = {spill: open_router(cl.coordinator, _name(spill), cl.up["etcd"],
                                      cl.up["cluster"]) for spill in cols}
        for nb in args.coordinator_batches:  # the same collections, another batching
            other = cl.extra_coordinator("--search-batches", str(nb))
            for spill in cols:
                key = (f"pyramid-batches{nb}", spill)
                targets[key] = ss.connect(other, timeout=600).collection(_name(spill))
                settings += [(key, {"branching": b, "ef": e, "part_effort": "uniform"})
                             for e in args.ef for b in args.branching]
        if args.client_routed:  # the router copied into this process, asking shards directly
            for spill, router in routers.items():
                targets[("pyramid-client", spill)] = router
                settings += [(("pyramid-client", spill),
                              {"branching": b, "ef": e, "part_effort": "uniform"})
                             for e in args.ef for b in args.branching]
        settings += [(b, {"ef": e}) for b in BASELINES if b in targets for e in args.naive_ef]
        for key, params in settings:
            target = targets[key]
            scheme, spill = key if isinstance(key, tuple) else (key, None)
            row = {"scheme": scheme, **params,
                   "recall": round(rec(target.search(queries, K, **params)), 4)}
            if spill is not None:
                row["spill"] = spill
                row["parts_per_query"] = round(float(
                    routers[spill].route(queries, params["branching"]).sum(1).mean()), 2)
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
        for router in routers.values():  # their etcd watches and shard connections
            router.parts[0].pool.close()
        cl.stop()
    out = {"metric": args.metric, "n_base": args.n_base, "n_queries": args.n_queries,
           "shards": args.shards, "n_centers": args.n_centers, "clients": args.clients,
           "seconds": args.seconds, "batch": args.batch, "turns": args.turns,
           "mips_replicas": args.mips_replicas, "spill": args.spill,
           "build_s": {"pyramid": t_pyr, "naive": t_naive},
           "load": os.getloadavg(), "rows": rows}
    RESULTS.mkdir(parents=True, exist_ok=True)
    tag = f"_{args.tag}" if args.tag else ""
    (RESULTS / f"pyramid_sweep_{args.metric}{tag}.json").write_text(json.dumps(out, indent=1))



def _name(spill: float) -> str:
    return "glove" if not spill else f"glove_spill{spill:g}".replace(".", "_")


def _label(r: dict) -> str:
    """A row's scheme, with its spill ratio when it has one."""
    return r["scheme"] + (f" (spill {r['spill']:g})" if r.get("spill") else "")


def table(paths) -> None:
    """Markdown tables from sweep JSON files. Beside each pyramid row, per baseline (naive:
    the client asks every shard; naive-coord: every part through the coordinator): its q/s
    over the best baseline q/s among baseline rows with recall at least as high ("q/s vs"),
    and the lowest baseline CPU per query among those rows over its own ("CPU gain")."""
    for path in paths:
        d = json.loads(Path(path).read_text())
        bs = d.get("batch", [1])
        print(f"\n{path}: glove-50 {d['metric']}, {d['n_base']} base, {d['n_queries']} queries, "
              f"{d['shards']} shard processes, {d['n_centers']} centres, {d['clients']} clients, "
              f"load {d['load'][0]:.1f}\n")
        base = {b: [r for r in d["rows"] if r["scheme"] == b] for b in BASELINES}
        base = {b: rs for b, rs in base.items() if rs}
        head = ["scheme", "K", "ef", "part effort", "recall@10"]
        for b in bs:
            head += [f"q/s b{b}", f"CPU ms/q b{b}"]
            head += [h for n in base for h in (f"q/s vs {n} b{b}", f"CPU gain vs {n} b{b}")]
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in d["rows"]:
            pyr = r["scheme"] not in BASELINES
            kcell = str(r.get("branching", "all"))
            if "parts_per_query" in r:
                kcell += f" ({r['parts_per_query']:.1f} parts)"
            cells = [_label(r), kcell, str(r["ef"]), r.get("part_effort", "uniform") if pyr
                     else "", f"{r['recall']:.3f}"]
            for b in bs:
                cells += [f"{r[f'qps_b{b}']:.0f}", f"{r[f'cpu_ms_b{b}']:.2f}"]
                for rows in base.values():
                    peers = [n for n in rows if n["recall"] >= r["recall"]]
                    ratio = gain = ""
                    if pyr and peers:
                        ratio = f"{r[f'qps_b{b}'] / max(n[f'qps_b{b}'] for n in peers):.2f}x"
                        gain = f"{min(n[f'cpu_ms_b{b}'] for n in peers) / r[f'cpu_ms_b{b}']:.2f}x"
                    cells += [ratio, gain]
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
    """Per file, batch size and baseline (``BASELINES`` present in the file): every pyramid
    row with recall >= min_recall beside the baseline interpolated to the same recall (q/s
    ratio and CPU gain); ``best``: only the row with the highest q/s ratio per scheme."""
    print("| data | batch | baseline | pyramid (K, ef, effort) | recall@10 | pyramid q/s | "
          "baseline q/s at equal recall | q/s ratio | pyramid CPU ms/q | baseline CPU ms/q | "
          "CPU gain |")
    print("|" + "---|" * 11)
    for path in paths:
        d = json.loads(Path(path).read_text())
        pyr = [r for r in d["rows"] if r["scheme"] not in BASELINES and
               r["recall"] >= min_recall]
        name = f"{d['metric']} {d['n_base'] // 1000}k, {d['shards']} shards ({Path(path).stem})"
        for b in d.get("batch", [1]):
            for base in BASELINES:
                naive = [r for r in d["rows"] if r["scheme"] == base]
                lines = []
                for r in sorted(pyr, key=lambda r: r["recall"]):
                    nq = naive_at(naive, r["recall"], f"qps_b{b}")
                    nc = naive_at(naive, r["recall"], f"cpu_ms_b{b}")
                    if nq is not None:
                        lines.append((r, nq, nc))
                if best:
                    lines = [max((t for t in lines if _label(t[0]) == sch),
                                 key=lambda t: t[0][f"qps_b{b}"] / t[1])
                             for sch in sorted({_label(t[0]) for t in lines})]
                for r, nq, nc in lines:
                    print(f"| {name} | {b} | {base} | {_label(r)}: K={r['branching']}, "
                          f"ef={r['ef']}, {r.get('part_effort', 'uniform')} | "
                          f"{r['recall']:.3f} | {r[f'qps_b{b}']:.0f} | {nq:.0f} | "
                          f"{r[f'qps_b{b}'] / nq:.2f}x | {r[f'cpu_ms_b{b}']:.2f} | {nc:.2f} | "
                          f"{nc / r[f'cpu_ms_b{b}']:.2f}x |")


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
            name = (f"{_label(r)} ef={r['ef']} {r.get('part_effort', 'uniform')}"
                    if r["scheme"] not in BASELINES else r["scheme"])
            groups.setdefault(name, []).append(r)
        for ax, b in zip(row, bs, strict=True):
            for name, rs in groups.items():
                rs = sorted(rs, key=lambda r: r["recall"])
                ax.plot([r["recall"] for r in rs], [r[f"qps_b{b}"] for r in rs], "o-" if
                        name not in BASELINES else "s--", label=name, ms=4)
                if name not in BASELINES:
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



"""Pyramid cluster benchmarks (docs/bench-pyramid.md) over real local processes.

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
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import load
from simsearch.eval import recall_at_k
from simsearch.pyramid.launcher import LocalCluster

RESULTS = Path("bench/results")
K = 10


class Cluster(LocalCluster):
    """A local cluster with the CPU time of its processes by role."""

    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_role().values())

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds so far of the shard servers and of the coordinator(s)."""
        tick = os.sysconf("SC_CLK_TCK")
        out = {"shards": 0.0, "coord": 0.0}
        for name, pid in [(r, i["pid"]) for r, i in self.up["processes"].items()]:
            try:
                f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                out["shards" if name.startswith("shard") else "coord"] += (
                    int(f[11]) + int(f[12])) / tick
            except OSError:
                pass
        return out


def data(metric: str, n_base: int, n_queries: int):
    ds = load("glove-50", n_base=n_base, n_queries=n_queries)
    base, queries = ds.base, ds.queries
    f = ss.FlatIndex(50, metric)
    f.add(base)
    gt = f.search(queries, 100)
    return base, queries, gt


def build(cl: Cluster, base, metric, n_parts, n_centers, sub, mips_replicas=300):
    client = ss.connect(cl.coordinator, timeout=600)
    col = client.create_collection("glove", 50, metric, "pyramid", n_centers=n_centers,
                                   n_partitions=n_parts, sub_index="hnsw",
                                   mips_replicas=mips_replicas, **sub)
    # k-means samples 100 x n_centers rows anyway; a subset keeps the call under gRPC's limit
    take = min(len(base), 200_000)
    col.train(base[np.random.default_rng(0).choice(len(base), take, replace=False)])
    for s in range(0, len(base), 20000):
        col.add(base[s : s + 20000], ids=np.arange(s, min(len(base), s + 20000)))
    return client, col


class Naive:
    """Random sharding over the same servers; every query to every shard, merged here."""

    def __init__(self, addresses, base, metric, sub, seed=0):
        self.clients = [ss.connect(a, timeout=600) for a in addresses]
        self.metric = metric
        part = np.random.default_rng(seed).integers(0, len(addresses), len(base))
        self.cols = []
        for j, c in enumerate(self.clients):
            col = c.create_collection("naive", 50, metric, "hnsw", **sub)
            rows = np.flatnonzero(part == j)
            for s in range(0, rows.size, 20000):
                col.add(base[rows[s : s + 20000]], ids=rows[s : s + 20000])
            self.cols.append(col)
        self.pool = ThreadPoolExecutor(32)

    def search(self, q, k, **params):
        from simsearch.pyramid._kernels import merge_topk_dedup

        rs = list(self.pool.map(lambda c: c.search(q, k, **params), self.cols))
        ids = np.concatenate([r.ids for r in rs], axis=1)
        sc = np.concatenate([r.scores for r in rs], axis=1)
        return ss.SearchResult(*merge_topk_dedup(ids, sc, k, self.metric != "l2"))


def closed_loop(search, queries, clients: int, seconds: float, cl: Cluster, batch: int = 1):
    """(calls' queries, wall seconds, CPU seconds by role) with ``clients`` threads each sending
    ``batch`` queries per call for ``seconds``; CPU of every process involved (shard servers,
    coordinator, and this client)."""
    stop = time.monotonic() + seconds
    counts = [0] * clients
    nb = len(queries) // batch

    def worker(t):
        i = t
        while time.monotonic() < stop:
            j = i % nb
            search(queries[j * batch : (j + 1) * batch])
            counts[t] += batch
            i += clients

    cpu0, me0, t0 = cl.cpu_by_role(), time.process_time(), time.monotonic()
    ths = [threading.Thread(target=worker, args=(t,)) for t in range(clients)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    wall = time.monotonic() - t0
    cpu1 = cl.cpu_by_role()
    cpu = {r: cpu1[r] - cpu0[r] for r in cpu0}
    cpu["client"] = time.process_time() - me0
    return sum(counts), wall, cpu


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
            from simsearch.pyramid.datapath import open_router

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


# ---------------------------------------------------------------------------------------------


def stream(col, queries, gt, base, metric, rate, seconds, events, params, baseline):
    """Open loop at ``rate`` q/s; events: [(t, fn)]. Returns per-query records."""
    pool = ThreadPoolExecutor(64)
    recs = []
    lock = threading.Lock()

    def one(i, t_sched):
        t0 = time.monotonic()
        try:
            r = col.search(queries[i], K, **params)
            ok = True
            hit = recall_at_k(r.ids, gt.ids[i : i + 1], K, gt_scores=gt.scores[i : i + 1],
                              queries=queries[i : i + 1], base=base, metric=metric)
        except Exception as exc:  # counted as failed
            ok, hit = False, type(exc).__name__
        with lock:
            recs.append({"t": t_sched, "lat": time.monotonic() - t0, "ok": ok, "recall": hit,
                         "healthy_recall": float(baseline[i])})

    start = time.monotonic()
    ev = sorted(events)
    n = int(rate * seconds)
    for i in range(n):
        t_sched = i / rate
        while ev and ev[0][0] <= t_sched:
            ev.pop(0)[1]()
        delay = start + t_sched - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        pool.submit(one, i % len(queries), t_sched)
    pool.shutdown(wait=True)
    return recs


def summarize(recs, lo, hi):
    sel = [r for r in recs if lo <= r["t"] < hi]
    ok = [r for r in sel if r["ok"]]
    lat = np.array([r["lat"] for r in ok]) * 1000
    return {"queries": len(sel), "failed": len(sel) - len(ok),
            "recall": round(float(np.mean([r["recall"] for r in ok])), 4) if ok else None,
            # the same queries answered by the healthy cluster before any fault
            "healthy_recall": round(float(np.mean([r["healthy_recall"] for r in ok])), 4)
            if ok else None,
            "max_ms": round(float(lat.max()), 1) if ok else None,
            "p50_ms": round(float(np.percentile(lat, 50)), 1) if ok else None,
            "p99_ms": round(float(np.percentile(lat, 99)), 1) if ok else None}


def faults(args) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    tmp = Path(tempfile.mkdtemp(prefix="pyrfault-"))
    cl = Cluster(tmp, 3, 2, "--restart-delay", "2")
    params = {"branching": 4, "ef": 64}
    out = {"metric": args.metric, "n_base": args.n_base, "rate": args.rate,
           "seconds": args.seconds, "load": os.getloadavg()}
    try:
        _, col = build(cl, base, args.metric, 3, args.n_centers, {"M": 16, "ef_construction": 100})
        T = args.seconds
        healthy = col.search(queries, K, **params)
        baseline = np.array([recall_at_k(healthy.ids[i : i + 1], gt.ids[i : i + 1], K,
                                         gt_scores=gt.scores[i : i + 1],
                                         queries=queries[i : i + 1], base=base,
                                         metric=args.metric) for i in range(len(queries))])
        kill_at = T / 4
        recs_kill = stream(col, queries, gt, base, args.metric, args.rate, T,
                           [(kill_at, lambda: os.kill(cl.pid("shard-0"), signal.SIGKILL))], params,
                           baseline)
        out["sigkill"] = {"before": summarize(recs_kill, 0, kill_at),
                          "after": summarize(recs_kill, kill_at, T)}
        print("sigkill", out["sigkill"], flush=True)
        time.sleep(8)  # let shard 0 rejoin before the next scenario
        stop_pid = cl.pid("shard-1")
        recs_stop = stream(col, queries, gt, base, args.metric, args.rate, T,
                           [(kill_at, lambda: os.kill(stop_pid, signal.SIGSTOP)),
                            (kill_at + 10, lambda: os.kill(stop_pid, signal.SIGCONT))], params,
                           baseline)
        out["sigstop"] = {"healthy": summarize(recs_stop, 0, kill_at),
                          "stopped": summarize(recs_stop, kill_at, kill_at + 10),
                          "after": summarize(recs_stop, kill_at + 10, T)}
        print("sigstop", out["sigstop"], flush=True)
        time.sleep(3)
        # writes: single items, SIGKILL a shard part-way; every acknowledged id must be found
        acked, failed = [], 0
        rng = np.random.default_rng(1)
        t_end = time.monotonic() + 12
        killed = False
        i = 0
        while time.monotonic() < t_end:
            if not killed and time.monotonic() > t_end - 8:
                os.kill(cl.pid("shard-2"), signal.SIGKILL)
                killed = True
            v = base[rng.integers(len(base))] + rng.normal(0, 0.05, 50).astype(np.float32)
            try:
                col.add(v[None], ids=[10_000_000 + i])
                acked.append((10_000_000 + i, v))
            except Exception:
                failed += 1
            i += 1
        time.sleep(8)  # let the shard restart and catch up
        lost = 0
        for id_, v in acked:  # through the coordinator: every part asked, the id in the top 10
            r = col.search(v, 10, branching=args.n_centers, ef=128)
            lost += int(id_ not in r.ids[0])
        status = subprocess.run([sys.executable, "-m", "simsearch.pyramid.cli", "status",
                                 "--data-dir", str(tmp)], capture_output=True, text=True)
        out["status_after"] = status.stdout
        print(status.stdout)
        # on the shards themselves: every acknowledged id on every replica of its part (cosine:
        # no MIPS copies, so each id must be found exactly `replicas` times)
        ack_ids = np.array([i for i, _ in acked], np.int64)
        per_replica = {}
        for a in cl.shard_addresses:
            c = ss.connect(a, timeout=60)
            for name in c.list_collections():
                per_replica[f"{a}/{name}"] = c.collection(name).remove(ack_ids, missing_ok=True)
        out["writes_sigkill"] = {"acked": len(acked), "failed_writes": failed,
                                 "not_found_via_coordinator": lost, "count_after": len(col),
                                 "acked_ids_found_per_replica": per_replica,
                                 "replica_copies_found": int(sum(per_replica.values())),
                                 "replica_copies_expected": 2 * len(acked)}
        print("writes", out["writes_sigkill"], flush=True)
    finally:
        cl.stop()
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"pyramid_faults_{args.metric}.json").write_text(json.dumps(
        {**out, "recs_kill": recs_kill, "recs_stop": recs_stop}, default=str))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.6))
    for ax, recs, title, marks in (
        (axes[0], recs_kill, "SIGKILL shard 0", [kill_at]),
        (axes[1], recs_stop, "SIGSTOP shard 1 (10 s)", [kill_at, kill_at + 10]),
    ):
        done = np.array([r["t"] + r["lat"] for r in recs if r["ok"]])
        bad = np.array([r["t"] for r in recs if not r["ok"]])
        bins = np.arange(0, args.seconds + 2, 1.0)
        ax.plot(bins[:-1], np.histogram(done, bins)[0], label="answered / s")
        if bad.size:
            ax.plot(bins[:-1], np.histogram(bad, bins)[0], label="failed / s")
        lat = [(r["t"], r["lat"] * 1000) for r in recs if r["ok"]]
        ax2 = ax.twinx()
        ax2.scatter(*zip(*lat, strict=True), s=2, c="gray", alpha=0.4)
        ax2.set_ylabel("latency ms (dots)")
        ax2.set_yscale("log")
        for m in marks:
            ax.axvline(m, color="red", ls="--")
        ax.set_title(title)
        ax.set_xlabel("s")
        ax.legend(loc="lower left")
    fig.tight_layout()
    Path("docs/img").mkdir(parents=True, exist_ok=True)
    fig.savefig(f"docs/img/pyramid_faults_{args.metric}.png", dpi=80)


def routing(args) -> None:
    """In process, exact (flat) parts: recall@10 and parts asked per query against K, so the
    routing alone is measured (no sub-index error, no network)."""
    from simsearch.eval import thread_limit
    from simsearch.pyramid import PyramidIndex

    base, queries, gt = data(args.metric, args.n_base, args.n_queries)
    rows = []
    with thread_limit(1):
        for tau in args.edge_tau:
            for m in args.n_centers_list:
                t0 = time.time()
                p = PyramidIndex(50, args.metric, n_centers=m, n_partitions=args.parts,
                                 sub_index="flat", edge_tau=tau,
                                 mips_replicas=args.mips_replicas)
                p.train(base)
                p.add(base)
                build = time.time() - t0
                for b in args.branching:
                    r = p.search(queries, K, branching=b)
                    rec = recall_at_k(r.ids, gt.ids, K, gt_scores=gt.scores, queries=queries,
                                      base=base, metric=args.metric)
                    row = {"edge_tau": tau, "n_centers": m, "K": b, "recall": round(rec, 4),
                           "parts_per_query": round(float(p.route(queries, b).sum(1).mean()), 2),
                           "build_s": round(build, 1)}
                    print(row, flush=True)
                    rows.append(row)
    RESULTS.mkdir(parents=True, exist_ok=True)
    centres = "-".join(map(str, args.n_centers_list))
    name = (f"pyramid_routing_{args.metric}_{args.parts}parts_{args.n_base // 1000}k_{centres}c"
            + (f"_r{args.mips_replicas}" if args.metric == "ip" else "") + ".json")
    (RESULTS / name).write_text(json.dumps(
        {"metric": args.metric, "n_base": args.n_base, "parts": args.parts, "rows": rows},
        indent=1))
    print("\n| edge_tau | centres | K | recall@10 (exact parts) | parts asked / query |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['edge_tau']} | {r['n_centers']} | {r['K']} | {r['recall']:.3f} | "
              f"{r['parts_per_query']:.2f} |")


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

"""The benchmark runner: a YAML config -> raw results (JSON) -> Markdown table and PNG plot.

Config (see ``bench/configs/``)::

    name: glove-ip                     # results go to bench/results/<name>/
    dataset: {name: glove-50, params: {n_queries: 1000}}
    metric: ip                         # ip | cosine | l2
    k: 10
    timing: {rounds: 3, latency_queries: 200, min_seconds: 0.1}
    compare: [[simsearch-hnsw, hnswlib]]   # candidate vs baseline, QPS at equal recall
    algorithms:
      - adapter: hnswlib               # a name in bench.registry.ADAPTERS
        label: hnswlib                 # optional; defaults to the adapter name
        build: {M: 16, ef_construction: [100, 200]}   # lists expand as a product
        search: {ef: [10, 20, 40]}                     # swept without rebuilding

How it measures. Every index is built once and kept. A first pass computes recall@k and the
method's work counter for every (index, search setting). Then ``rounds`` timing rounds each visit
every setting of every algorithm. Runs that share a search setting (hnswlib and simsearch-hnsw at
ef=40, say) form a group whose members take turns call by call (two calls each, the order
rotating), so compared peers see the same machine noise and cache state; the group order flips
every round, and every run keeps its best. Per
group and round: the whole query batch at each thread count (each member repeated until
``min_seconds``), then one-query-at-a-time latency on the first ``latency_queries`` queries at one
thread. QPS is reported from wall time and, at one thread, from the calling thread's CPU time,
which other processes on a shared machine disturb much less. Latency statistics are taken over
each query's best time across rounds (machine noise out, per-query difficulty kept).
"""

from __future__ import annotations

import gc
import itertools
import json
import logging
import os
import platform
import re
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from tqdm.auto import tqdm

from simsearch import datasets
from simsearch.eval import (
    latency_stats,
    markdown_table,
    pareto_frontier,
    plot_recall_qps,
    recall_at_k,
    thread_limit,
    value_at_recall,
)

from .registry import ADAPTERS, make_adapter

log = logging.getLogger(__name__)

BENCH_DIR = Path(__file__).resolve().parent
CONFIG_DIR = BENCH_DIR / "configs"
RESULTS_DIR = BENCH_DIR / "results"
RESULTS_FILE = "results.json"
TIMING_DEFAULTS = {"rounds": 3, "latency_queries": 200, "min_seconds": 0.1}


# -- config --------------------------------------------------------------------------------------


def config_path(name_or_path: str | os.PathLike) -> Path:
    """A config file path, or the name of one in ``bench/configs`` (with or without .yaml)."""
    p = Path(name_or_path)
    if p.exists():
        return p
    for cand in (CONFIG_DIR / f"{name_or_path}.yaml", CONFIG_DIR / str(name_or_path)):
        if cand.exists():
            return cand
    known = ", ".join(list_configs())
    raise FileNotFoundError(f"no config {str(name_or_path)!r}; known configs: {known}")


def list_configs() -> list[str]:
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def load_config(name_or_path: str | os.PathLike) -> dict[str, Any]:
    """Read and check a YAML config; fills defaults."""
    path = config_path(name_or_path)
    cfg = yaml.safe_load(path.read_text())
    for key in ("dataset", "metric", "k", "algorithms"):
        if key not in cfg:
            raise ValueError(f"{path}: missing key {key!r}")
    cfg.setdefault("name", path.stem)
    cfg["dataset"].setdefault("params", {})
    cfg["timing"] = TIMING_DEFAULTS | cfg.get("timing", {})
    cfg.setdefault("compare", [])
    for algo in cfg["algorithms"]:
        if algo.get("adapter") not in ADAPTERS:
            raise ValueError(
                f"{path}: unknown adapter {algo.get('adapter')!r}; known: {sorted(ADAPTERS)}"
            )
        algo.setdefault("label", algo["adapter"])
        algo.setdefault("build", {})
        algo.setdefault("search", {})
    return cfg


def grid(params: dict[str, Any]) -> list[dict[str, Any]]:
    """Expand a dict whose list values are alternatives into the product of dicts."""
    keys = list(params)
    values = [v if isinstance(v, list) else [v] for v in params.values()]
    return [dict(zip(keys, combo, strict=True)) for combo in itertools.product(*values)]


# -- measuring -----------------------------------------------------------------------------------


@contextmanager
def _quiet_gc():
    """No garbage collection pauses inside a timed region."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _rotated(group: list[dict], i: int) -> list[dict]:
    """The group's members in turn i: rotated by i, so every member follows every other one
    equally often (a reversed order would always leave the middle member after another index,
    with a colder cache than the ends, which at the turn boundary follow themselves)."""
    i %= len(group)
    return group[i:] + group[:i]


def _time_batches(group: list[dict], q, k, threads: int, min_seconds: float) -> None:
    """Time whole-batch query calls at ``threads`` threads for every run in ``group`` (runs that
    share a search setting), taking turns (two calls per member per turn, the order rotating
    between turns) until each has had ``min_seconds`` of wall time, so peers see the same
    machine noise and the same cache state; keep each run's best wall and CPU time as QPS.
    CPU time is the calling thread's (``time.thread_time``): at one thread every adapter
    computes in the calling thread, so it is the wall time of a quiet machine, immune to other
    processes taking the cores (not to their cache and memory traffic)."""
    best = {id(r): [np.inf, np.inf] for r in group}
    spent, rep = 0.0, 0
    with thread_limit(threads), _quiet_gc():
        while rep == 0 or spent < min_seconds * len(group):
            for r in _rotated(group, rep):
                a = r["_adapter"]
                a.n_threads = threads
                for _ in range(2):
                    c, t = time.thread_time(), time.perf_counter()
                    a.query(q, k, **r["search"])
                    dt, dc = time.perf_counter() - t, time.thread_time() - c
                    b = best[id(r)]
                    b[0], b[1], spent = min(b[0], dt), min(b[1], dc), spent + dt
            rep += 1
    for r in group:
        wall, cpu = best[id(r)]
        key = str(threads)
        r["qps"][key] = max(r["qps"].get(key, 0.0), len(q) / wall)
        if threads == 1:
            r["qps_cpu_1t"] = max(r["qps_cpu_1t"] or 0.0, len(q) / max(cpu, 1e-9))


def _time_latency(group: list[dict], q, k) -> None:
    """One query per call at one thread, the members of ``group`` taking turns query by query
    (each query twice in a row per member, the faster counts; the order rotates); keeps each
    query's best (wall, CPU) seconds across rounds in ``run["_lat"]`` (2, len(q))."""
    lat = {id(r): np.empty((2, len(q))) for r in group}
    with thread_limit(1), _quiet_gc():
        for r in group:
            r["_adapter"].n_threads = 1
        for i in range(len(q)):
            qi = q[i : i + 1]
            for r in _rotated(group, i):
                for j in range(2):
                    c, t = time.thread_time(), time.perf_counter()
                    r["_adapter"].query(qi, k, **r["search"])
                    dt = (time.perf_counter() - t, time.thread_time() - c)
                    lat[id(r)][:, i] = dt if j == 0 else np.minimum(lat[id(r)][:, i], dt)
    for r in group:
        np.minimum(r["_lat"], lat[id(r)], out=r["_lat"])
        r["latency"], r["latency_cpu"] = map(latency_stats, r["_lat"])


def _environment() -> dict[str, Any]:
    import faiss
    import hnswlib  # noqa: F401

    import simsearch

    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=BENCH_DIR,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", "src"], cwd=BENCH_DIR)
        commit += "+dirty src" if dirty.returncode else ""
    except (OSError, subprocess.CalledProcessError):
        commit = None
    from importlib.metadata import version

    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
        "faiss": faiss.__version__,
        "hnswlib": version("hnswlib"),
        "simsearch": simsearch.__version__,
        "git_commit": commit,
    }


def run(
    config: str | os.PathLike | dict,
    out_dir: str | os.PathLike | None = None,
    threads: list[int] | None = None,
    rounds: int | None = None,
    progress: bool = True,
    ann_results: str | os.PathLike | None = None,
) -> Path:
    """Run a benchmark config; write ``results.json`` then the report into ``out_dir``
    (default ``bench/results/<config name>``). ``threads``: thread counts for batch QPS
    (default 1 and all cores). ``ann_results``: also write every run as an ann-benchmarks
    result file under ``<ann_results>/<dataset>/<k>/<algorithm>/`` (their plotting reads it).
    Returns the output directory."""
    cfg = config if isinstance(config, dict) else load_config(config)
    timing = dict(cfg["timing"])
    if rounds is not None:
        timing["rounds"] = rounds
    threads = sorted(set(threads or [1, os.cpu_count() or 1]))
    out = Path(out_dir) if out_dir else RESULTS_DIR / cfg["name"]
    out.mkdir(parents=True, exist_ok=True)
    metric, k = cfg["metric"], int(cfg["k"])

    t0 = time.perf_counter()
    ds = datasets.load(cfg["dataset"]["name"], **cfg["dataset"]["params"])
    gt_ids, gt_scores = ds.ground_truth(metric, k=max(k, 100))
    gt_ids, gt_scores = gt_ids[:, :k], gt_scores[:, :k]
    q, base = ds.queries, ds.base
    q_lat = q[: timing["latency_queries"]]
    log.info(
        "dataset %s: base %s, queries %s (%.1f s)",
        ds.name,
        base.shape,
        q.shape,
        time.perf_counter() - t0,
    )

    # builds: every index once, kept for the whole sweep
    specs = [(a, bp) for a in cfg["algorithms"] for bp in grid(a["build"])]
    built = []
    for algo, bp in tqdm(specs, desc="build", disable=not progress):
        adapter = make_adapter(algo["adapter"], metric, **bp)
        with thread_limit(max(threads)), _quiet_gc():
            t = time.perf_counter()
            adapter.fit(base)
            build_s = time.perf_counter() - t
        log.info("built %s %s in %.2f s", algo["label"], bp, build_s)
        built.append(
            {
                "algo": algo,
                "adapter": adapter,
                "build": bp,
                "build_s": build_s,
                "index_bytes": adapter.index_bytes(),
            }
        )

    # first pass: recall and work counters (also a warm-up)
    runs = []
    for b in built:
        for sp in grid(b["algo"]["search"]):
            a = b["adapter"]
            a.n_threads = 1
            with thread_limit(1):
                ids = a.query(q, k, **sp)
            rec = recall_at_k(
                ids, gt_ids, k, gt_scores=gt_scores, queries=q, base=base, metric=metric
            )
            runs.append(
                {
                    "algorithm": b["algo"]["label"],
                    "adapter": a.name,
                    "build": b["build"],
                    "search": sp,
                    "recall": rec,
                    "exact": a.exact,
                    "qps": {},
                    "qps_cpu_1t": None,
                    "latency": {},
                    "latency_cpu": {},
                    "build_s": b["build_s"],
                    "index_bytes": b["index_bytes"],
                    "work": a.work(),
                    "_adapter": a,
                    "_ids": ids,
                    "_lat": np.full((2, len(q_lat)), np.inf),
                }
            )

    def save() -> None:
        doc = {
            "config": cfg,
            "threads": threads,
            "env": env,
            "elapsed_s": time.perf_counter() - t0,
            "dataset": {
                "name": ds.name,
                "params": ds.params,
                "n": len(base),
                "dim": base.shape[1],
                "n_queries": len(q),
                "latency_queries": len(q_lat),
            },
            "runs": [{key: v for key, v in r.items() if not key.startswith("_")} for r in runs],
        }
        tmp = out / f".{RESULTS_FILE}.tmp"
        tmp.write_text(json.dumps(doc, indent=1, default=_jsonable))
        tmp.replace(out / RESULTS_FILE)

    env = _environment()
    save()

    # timing rounds over groups of runs sharing a search setting (peers at the same ef, say),
    # measured call by call in alternation; the group order flips every round
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(json.dumps(r["search"], sort_keys=True), []).append(r)
    group_list = [groups[key] for key in sorted(groups)]
    with tqdm(total=timing["rounds"] * len(runs), desc="sweep", disable=not progress) as bar:
        for rnd in range(timing["rounds"]):
            for group in group_list if rnd % 2 == 0 else group_list[::-1]:
                for n in threads:
                    _time_batches(group, q, k, n, timing["min_seconds"])
                _time_latency(group, q_lat, k)
                bar.update(len(group))
            save()
    log.info("results in %s (%.1f s)", out / RESULTS_FILE, time.perf_counter() - t0)
    if ann_results is not None:
        write_ann_results(runs, ann_results, ds.name, metric, k, q, base)
    report(out)
    return out


def write_ann_results(runs: list[dict], root: str | os.PathLike, dataset: str, metric: str,
                      k: int, q: np.ndarray, base: np.ndarray) -> list[Path]:
    """Every run as an ann-benchmarks result file (``simsearch.annbench.write_result``): the
    returned ids, their distances in ann-benchmarks' measure, and per-query time 1 / (1-thread
    batch q/s), the quantity their q/s axis shows."""
    from simsearch.annbench import write_result

    paths = []
    for r in runs:
        ids = np.asarray(r["_ids"], np.int64)
        safe = np.maximum(ids, 0)
        x = base[safe]  # (nq, k, d)
        if metric == "l2":
            dist = np.sqrt(np.maximum(((x - q[:, None, :]) ** 2).sum(-1), 0.0))
        elif metric == "cosine":
            qn = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-30)
            xn = x / np.maximum(np.linalg.norm(x, axis=2, keepdims=True), 1e-30)
            dist = 1.0 - np.einsum("qkd,qd->qk", xn, qn)
        else:  # ann-benchmarks' "dot": smaller is better, so the negated inner product
            dist = -np.einsum("qkd,qd->qk", x, q)
        dist[ids < 0] = np.inf
        qps = r["qps"].get("1") or max(r["qps"].values(), default=0.0) or float("nan")
        name = f"{r['algorithm']}({_params({**r['build'], **r['search']})})"
        folder = Path(root) / dataset / str(k) / r["algorithm"]
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / (re.sub(r"[^A-Za-z0-9_.=-]+", "_", name) + ".hdf5")
        write_result(path, algo=r["algorithm"], dataset=dataset, metric=metric, k=k,
                     neighbors=ids, distances=dist, times=np.full(len(q), 1.0 / qps),
                     build_time=r["build_s"], index_size=r["index_bytes"] / 1024, name=name)
        paths.append(path)
    log.info("%d ann-benchmarks result files under %s", len(paths), root)
    return paths


def _jsonable(v: Any) -> Any:
    if isinstance(v, np.generic):
        return v.item()
    if isinstance(v, np.ndarray):
        return v.tolist()
    raise TypeError(f"not JSON serializable: {type(v).__name__}")


# -- reporting -----------------------------------------------------------------------------------


def _params(d: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in d.items()) if d else "-"


def _interp_log_qps(front: list[tuple[float, float]], recall: float) -> float | None:
    """QPS of a Pareto frontier at ``recall`` (linear in log QPS); None outside its range."""
    return value_at_recall(front, recall, below="none")


def _ratio(a: float | None, b: float | None) -> str:
    return f"{a / b:.3f}" if a and b else ""


def _measures(doc: dict) -> dict[str, str]:
    """QPS measures in a results file: key -> human label. "1t-cpu" is one thread by CPU time."""
    out = {}
    for t in (str(t) for t in doc["threads"]):
        out[f"{t}t"] = f"{t} thread{'s' if t != '1' else ''}, wall time"
        if t == "1":
            out["1t-cpu"] = "1 thread, CPU time"
    return out


def _qps(r: dict, measure: str) -> float | None:
    return r.get("qps_cpu_1t") if measure == "1t-cpu" else r["qps"].get(measure[:-1])


def compare(runs: list[dict], candidate: str, baseline: str, measures: list[str]) -> list[dict]:
    """Rows comparing ``candidate`` to ``baseline`` (the candidate's QPS over the baseline's)
    per search setting: at the same setting where the build settings match too, and at equal
    recall (the baseline's Pareto frontier, log-interpolated at the candidate's recall, by the
    first measure). Also the per-call latency ratio and overhead (one query per call, CPU time)."""
    cand = [r for r in runs if r["algorithm"] == candidate and r["qps"]]
    base = [r for r in runs if r["algorithm"] == baseline and r["qps"]]
    m0 = measures[0]
    front = pareto_frontier([(r["recall"], _qps(r, m0)) for r in base if _qps(r, m0)])
    rows = []
    for c in sorted(cand, key=lambda r: (r["recall"], _params(r["search"]))):
        twin = next(
            (b for b in base if b["build"] == c["build"] and b["search"] == c["search"]), None
        )
        row = {
            "search": _params(c["search"]),
            "recall": f"{c['recall']:.4f}" + (f" / {twin['recall']:.4f}" if twin else ""),
        }
        for m in measures:
            row[f"ratio {m}"] = _ratio(_qps(c, m), twin and _qps(twin, m))
        at = _interp_log_qps(front, c["recall"])
        row[f"ratio {m0}, equal recall"] = _ratio(_qps(c, m0), at)
        lc, lb = c.get("latency_cpu", {}), (twin or {}).get("latency_cpu", {})
        if lc and lb:
            row["per-call latency ratio"] = _ratio(lc["mean_ms"], lb["mean_ms"])
            row["per-call overhead µs"] = f"{(lc['mean_ms'] - lb['mean_ms']) * 1e3:.1f}"
        rows.append(row)
    return rows


def report(out_dir: str | os.PathLike) -> tuple[Path, list[Path]]:
    """Derive ``results.md`` and recall/QPS PNGs (one per QPS measure) from ``results.json``."""
    out = Path(out_dir)
    doc = json.loads((out / RESULTS_FILE).read_text())
    cfg, runs, ds, env = doc["config"], doc["runs"], doc["dataset"], doc["env"]
    k, measures = cfg["k"], _measures(doc)
    timed = [r for r in runs if r["qps"]]

    pngs = []
    for m, label in measures.items():
        series: dict[str, list[tuple[float, float]]] = {}
        for r in timed:
            if _qps(r, m):
                series.setdefault(r["algorithm"], []).append((r["recall"], _qps(r, m)))
        title = f"{cfg['name']}: {ds['name']} n={ds['n']:,} d={ds['dim']} {cfg['metric']}"
        path = out / f"recall_qps_{m}.png"
        pngs.append(plot_recall_qps(series, path, f"{title}\n{label}", xlabel=f"recall@{k}"))

    rows = []
    for r in sorted(runs, key=lambda r: (r["algorithm"], _params(r["build"]), r["recall"])):
        lat = r["latency"]
        row = {
            "algorithm": r["algorithm"],
            "build": _params(r["build"]),
            "search": _params(r["search"]),
            f"recall@{k}": f"{r['recall']:.4f}",
        }
        for m in measures:
            row[f"QPS {m}"] = f"{_qps(r, m):,.0f}" if _qps(r, m) else ""
        row |= {
            "mean ms": f"{lat['mean_ms']:.3g}" if lat else "",
            "p99 ms": f"{lat['p99_ms']:.3g}" if lat else "",
            "build s": f"{r['build_s']:.1f}",
            "index MB": f"{r['index_bytes'] / 2**20:.1f}",
            "work/query": _params({key: round(v) for key, v in (r["work"] or {}).items()}),
        }
        rows.append(row)

    lines = [
        f"# {cfg['name']}",
        "",
        f"Dataset `{ds['name']}` {ds['params']}: {ds['n']:,} × {ds['dim']} base, "
        f"{ds['n_queries']:,} queries; metric `{cfg['metric']}`, recall@{k} (tie-tolerant).",
        "",
        f"QPS: the whole query batch per call, best of {cfg['timing']['rounds']} alternating "
        "rounds; `1t`, `2t`: wall time at 1 and 2 threads; `1t-cpu`: the calling thread's CPU "
        "time at 1 thread (robust to other load on a shared machine). Latency: one query per "
        f"call, 1 thread, wall time, {ds['latency_queries']} queries (each query's best round). "
        f"Machine: {env['cpu_count']} cores, {env['date']}, commit {env['git_commit']}; faiss "
        f"{env['faiss']}, hnswlib {env['hnswlib']}, numpy {env['numpy']}. "
        f"Run took {doc['elapsed_s']:.0f} s.",
        "",
        markdown_table(rows, list(rows[0]) if rows else []),
        "",
    ]
    order = ["1t-cpu"] + [m for m in measures if m != "1t-cpu"]
    for cand, baseline in cfg.get("compare", []):
        crow = compare(timed, cand, baseline, [m for m in order if m in measures])
        if crow:
            lines += [
                f"## {cand} vs {baseline}",
                "",
                f"QPS ratios {cand} / {baseline}; recall {cand} / {baseline}.",
                "",
                markdown_table(crow, list(crow[0])),
                "",
            ]
            for m in [m for m in order if m in measures]:
                vals = [float(row[f"ratio {m}"]) for row in crow if row[f"ratio {m}"]]
                if vals:
                    lines.append(
                        f"- QPS ratio {m}, same setting: median {np.median(vals):.3f}, geometric "
                        f"mean {np.exp(np.mean(np.log(vals))):.3f}, range {min(vals):.3f}–"
                        f"{max(vals):.3f} over {len(vals)} settings"
                    )
            lines.append("")
    lines += [f"![{label}]({p.name})" for label, p in zip(measures.values(), pngs, strict=True)]
    md = out / "results.md"
    md.write_text("\n".join(lines) + "\n")
    return md, pngs

"""ip-NSW+ against its peers at target recalls, from runner results (``results.json``).

For each method and target recall, the cheapest setting that reaches the target (no
interpolation): its distance computations per query and queries/s. Ratios are ip-NSW+ over
the baseline, each at its own cheapest setting, all from the same run.

    python -m bench.graph.targets bench/results/graph-longtail [--targets 0.9 0.95]
        [--plot-dir docs/img]   # recall against distance computations
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simsearch.eval import markdown_table

CANDIDATE = "ipnsw-plus"
BASELINES = ("hnswlib-counted", "faiss-hnsw")


def cheapest(runs: list[dict], algorithm: str, target: float, key) -> dict | None:
    ok = [r for r in runs if r["algorithm"] == algorithm and r["recall"] >= target and r["qps"]]
    return max(ok, key=key) if ok else None


def table(results_dir: str | Path, targets: list[float]) -> str:
    doc = json.loads((Path(results_dir) / "results.json").read_text())
    runs = doc["runs"]
    rows = []
    for target in targets:
        best = {}
        for algo in (CANDIDATE, *BASELINES):
            by_qps = cheapest(runs, algo, target, lambda r: r.get("qps_cpu_1t") or r["qps"]["1"])
            by_work = cheapest(
                runs, algo, target, lambda r: -(r["work"] or {}).get("distances", float("inf"))
            )
            best[algo] = (by_qps, by_work)
            if by_qps is None:
                rows.append({"target": target, "method": algo, "setting": "not reached"})
                continue
            rows.append({
                "target": target, "method": algo,
                "setting": " ".join(f"{k}={v}" for k, v in by_qps["search"].items()),
                "recall": by_qps["recall"],
                "QPS 1t": by_qps["qps"]["1"], "QPS 1t-cpu": by_qps.get("qps_cpu_1t", ""),
                "QPS 2t": by_qps["qps"].get("2", ""),
                "fewest distances": (by_work["work"] or {}).get("distances", ""),
            })  # fmt: skip
        c = best[CANDIDATE]
        for base in BASELINES:
            b = best[base]
            if c[0] is None or b[0] is None:
                continue
            cw, bw = (c[1]["work"] or {}).get("distances"), (b[1]["work"] or {}).get("distances")
            rows.append({
                "target": target, "method": f"ratio {CANDIDATE} / {base}",
                "QPS 1t": c[0]["qps"]["1"] / b[0]["qps"]["1"],
                "QPS 1t-cpu": (c[0]["qps_cpu_1t"] / b[0]["qps_cpu_1t"]
                               if c[0].get("qps_cpu_1t") and b[0].get("qps_cpu_1t") else ""),
                "QPS 2t": (c[0]["qps"]["2"] / b[0]["qps"]["2"]
                           if "2" in c[0]["qps"] and "2" in b[0]["qps"] else ""),
                "fewest distances": cw / bw if cw and bw else "",
            })  # fmt: skip
    cols = ["target", "method", "setting", "recall", "QPS 1t", "QPS 1t-cpu", "QPS 2t",
            "fewest distances"]  # fmt: skip
    ds = doc["dataset"]
    head = f"`{ds['name']}` {ds['params']}: {ds['n']:,} × {ds['dim']}, {ds['n_queries']:,} queries"
    return head + "\n\n" + markdown_table(rows, cols)


def plot_work(results_dir: str | Path, path: str | Path) -> Path:
    """Recall@k against distance computations per query (log axis), one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    doc = json.loads((Path(results_dir) / "results.json").read_text())
    fig, ax = plt.subplots(figsize=(7, 5))
    for algo in sorted({r["algorithm"] for r in doc["runs"]}):
        pts = sorted((r["recall"], r["work"]["distances"]) for r in doc["runs"]
                     if r["algorithm"] == algo and (r["work"] or {}).get("distances"))  # fmt: skip
        if pts:
            ax.plot(*zip(*pts, strict=True), marker="o", ms=4, label=algo)
    ds = doc["dataset"]
    ax.set_yscale("log")
    ax.set_xlabel(f"recall@{doc['config']['k']}")
    ax.set_ylabel("distance computations / query (log)")
    ax.set_title(f"{ds['name']} n={ds['n']:,} d={ds['dim']} ip")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("dirs", nargs="+")
    p.add_argument("--targets", type=float, nargs="+", default=[0.9, 0.95])
    p.add_argument("--plot-dir", help="also write <dir>/graph-<results dir>-work.png")
    args = p.parse_args(argv)
    for d in args.dirs:
        print(table(d, args.targets))
        print()
        if args.plot_dir:
            print("plot:", plot_work(d, Path(args.plot_dir) / f"{Path(d).name}-work.png"))


if __name__ == "__main__":
    main()

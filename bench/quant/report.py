"""Tables and plots for docs/bench/quant.md from bench/results/quant/*.json (written by
bench/quant/bench.py): recall@k within the top T per method, and recall@20 against T as PNGs.

    python -m bench.quant.report glove-50-pq-opq-rq glove-50k-lsq ... --png-dir docs/img
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simsearch.eval import markdown_table

from .bench import RESULTS, TS


def load(tag: str) -> dict:
    return json.loads((RESULTS / f"{tag}.json").read_text())


def tables(tag: str, k: int = 20) -> str:
    doc = load(tag)
    rows = []
    for r in doc["rows"]:
        row = {"method": r["method"], "bits": r["bits"], "n": r.get("n", doc["n"])}
        row |= {f"T={t}": r[f"r{k}@{t}"] for t in TS}
        rows.append(row)
    return markdown_table(rows, ["method", "bits", "n"] + [f"T={t}" for t in TS])


def qps_table(tag: str) -> str:
    doc = load(tag)
    return markdown_table(doc["qps"], list(doc["qps"][0])) if doc.get("qps") else ""


def summary(tags: list[str], t: int = 64, k: int = 20) -> str:
    """One row per (dataset run, base, bits): baseline vs NEQ recall@k within the top t."""
    rows = []
    for tag in tags:
        doc = load(tag)
        by = {(r["base"], r["bits"], r["side"]): r for r in doc["rows"]}
        for (base, bits, side), r in by.items():
            if side != "faiss" or (base, bits, "neq") not in by:
                continue
            b, n = r[f"r{k}@{t}"], by[(base, bits, "neq")][f"r{k}@{t}"]
            rows.append({
                "run": tag, "n": r.get("n", doc["n"]), "base": base.upper(), "bits": bits,
                "base quantizer": b, "NEQ": n, "NEQ - base": n - b,
            })  # fmt: skip
    cols = ["run", "n", "base", "bits", "base quantizer", "NEQ", "NEQ - base"]
    return markdown_table(rows, cols)


def plot(tags: list[str], title: str, path: Path, k: int = 20, drop=()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for t in tags for r in load(t)["rows"] if f"{t}:{r['base']}" not in drop]
    bits = sorted({r["bits"] for r in rows})
    fig, axes = plt.subplots(1, len(bits), figsize=(5.5 * len(bits), 4), squeeze=False)
    colors = {"pq": "C0", "opq": "C1", "rq": "C2", "lsq": "C3"}
    for ax, b in zip(axes[0], bits, strict=True):
        for r in rows:
            if r["bits"] != b:
                continue
            neq = r["side"] == "neq"
            ax.plot(TS, [r[f"r{k}@{t}"] for t in TS], color=colors[r["base"]],
                    ls="-" if neq else "--", marker="o" if neq else "x", ms=4,
                    label=r["method"])  # fmt: skip
        ax.set_xscale("log", base=4)
        ax.set_xlabel("T (top items of the scan)")
        ax.set_ylabel(f"recall@{k} within top T")
        ax.set_title(f"{title}, {b} bits")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)
    plt.close(fig)


def plot_ivf(tags: list[str], path: Path) -> None:
    """recall@10 against queries/s over n_probe: NEQ-PQ with lists vs IndexIVFPQ."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(tags), figsize=(5.5 * len(tags), 4), squeeze=False)
    for ax, tag in zip(axes[0], tags, strict=True):
        doc = load(tag)
        rows, a = doc["rows"], doc["args"]
        for key, label, style in (("ivfpq", "faiss IndexIVFPQ", "--x"),
                                  ("neq_ivf", "NEQ-PQ, n_lists", "-o")):  # fmt: skip
            ax.plot([r[f"{key}_r10"] for r in rows], [r[f"{key}_qps"] for r in rows], style,
                    ms=4, label=label)  # fmt: skip
            for r in rows:
                ax.annotate(str(r["n_probe"]), (r[f"{key}_r10"], r[f"{key}_qps"]), fontsize=6)
        ax.set_yscale("log")
        ax.set_xlabel("recall@10 (no re-ranking)")
        ax.set_ylabel("queries/s, one thread")
        ax.set_title(f"{doc['n']:,} x {doc['dim']}, {a['codebooks']} B/item, {a['n_lists']} lists")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    _save(fig, path)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("tags", nargs="+")
    ap.add_argument("--k", type=int, default=20)
    ap.add_argument("--png", default=None, help="write one plot of all tags here")
    ap.add_argument("--title", default="")
    ap.add_argument("--summary", action="store_true", help="only the T=64 summary of all tags")
    ap.add_argument("--ivf", action="store_true", help="tags are quant_ivf_bench runs")
    ap.add_argument("--drop", nargs="*", default=(), help="TAG:BASE rows left out of the plot")
    args = ap.parse_args(argv)
    if args.ivf:
        for t in args.tags:
            doc = load(t)
            print(f"### {t}\n\n{markdown_table(doc['rows'], list(doc['rows'][0]))}\n")
        if args.png:
            plot_ivf(args.tags, Path(args.png))
        return
    if args.summary:
        print(summary(args.tags))
        return
    for t in args.tags:
        print(f"### {t}: recall@{args.k} within top T\n\n{tables(t, args.k)}\n")
        q = qps_table(t)
        if q:
            print(f"scan queries/s (k=10, one thread):\n\n{q}\n")
    if args.png:
        plot(args.tags, args.title, Path(args.png), args.k, set(args.drop))


if __name__ == "__main__":
    main()

"""CNN-ED string search benchmark: recall against the number of re-ranked candidates T for CNN-ED
and CGK, end-to-end queries/s of the StringIndex against brute-force rapidfuzz, training time and
embedding throughput.

    python -m bench.strings.bench words      # 100,000 base words, 1,000 queries, max_len 32
    python -m bench.strings.bench proteins   # 50,000 proteins truncated to 512, 1,000 queries

Raw results: bench/results/strings/<dataset>.json; recall plot: docs/img/strings-<dataset>.png.
Everything runs single-threaded (training included: the encoder's default).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import time
from pathlib import Path

import numpy as np

from simsearch.datasets import load_strings
from simsearch.eval import thread_limit
from simsearch.flat import FlatIndex
from simsearch.strings import (
    CGKEncoder,
    CNNEDEncoder,
    StringIndex,
    edit_distance_matrix,
    hamming_search,
)
from simsearch.strings.brute import distances_with_cutoff

log = logging.getLogger("strings_bench")
ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "words": dict(n_base=100_000, max_len=None, embed_max_len=32, brute_queries=200),
    "proteins": dict(n_base=50_000, max_len=512, embed_max_len=512, brute_queries=50),
}
TS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1024, 2048, 4096)
KS = (1, 10, 50)


def recall_curves(queries, base, cand, gt_d):
    """Tie-tolerant top-k recall of "re-rank the first T candidates" for every T and k: a
    returned item is a hit when its edit distance is within the true k-th distance."""
    nq, tmax = cand.shape
    d = np.stack([edit_distance_matrix([q], [base[j] for j in c])[0]
                  for q, c in zip(queries, cand.tolist(), strict=True)])
    out = {}
    for T in TS:
        best = np.sort(d[:, :T], axis=1)
        out[T] = {}
        for k in KS:
            kk = min(k, T)
            hits = (best[:, :kk] <= gt_d[:, k - 1 : k]).sum(1)
            out[T][k] = float((hits / k).mean())
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset", choices=sorted(CONFIGS))
    ap.add_argument("--n-queries", type=int, default=1000)
    ap.add_argument("--encoder", help="load this saved encoder instead of training")
    ap.add_argument("--epochs", type=int, default=None, help="override the default epochs")
    ap.add_argument("--global-channels", type=int, default=None,
                    help="whole-string bigram features (default: the encoder's)")
    ap.add_argument("--n-train", type=int, default=None, help="override the training sample")
    ap.add_argument("--channels", type=int, default=None, help="convolution channels")
    ap.add_argument("--profile", type=int, choices=(0, 1), default=None,
                    help="letter/letter-pair count path (default: the encoder's, on for deep)")
    ap.add_argument("--approx-form", default=None, choices=("paper", "relative", "log"),
                    help="approximation term (default: the encoder's)")
    ap.add_argument("--learning-rate", type=float, default=None, help="override Adam's rate")
    ap.add_argument("--embed-dim", type=int, default=128, help="embedding dimension")
    ap.add_argument("--eval-queries", type=int, default=None,
                    help="measure on the first N queries only (a loaded machine)")
    ap.add_argument("--e2e-ts", default="10,20,50,100,200,500,1024,2048,4096",
                    help="T values of the end-to-end runs")
    ap.add_argument("--brute-queries", type=int, default=None, help="queries timed by brute force")
    ap.add_argument("--e2e-only", action="store_true",
                    help="skip the recall-vs-T curves (CNN-ED and CGK)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "strings"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    cfg = CONFIGS[args.dataset]
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    res: dict = {"dataset": args.dataset, "config": cfg, "host": platform.node(),
                 "args": vars(args)}

    ds = load_strings(args.dataset, n_queries=args.n_queries, n_base=cfg["n_base"],
                      max_len=cfg["max_len"])
    base, queries = ds.base, ds.queries
    _, gt_d = ds.ground_truth(50)
    if args.eval_queries:
        queries, gt_d = queries[: args.eval_queries], gt_d[: args.eval_queries]
    log.info("%s: %d base, %d queries measured", args.dataset, len(base), len(queries))

    # -- training -------------------------------------------------------------------------
    enc_path = out_dir / f"{args.dataset}-encoder.sim"
    if args.encoder:
        enc = CNNEDEncoder.load(args.encoder)
        res["training"] = {"loaded": args.encoder}
    else:
        enc = CNNEDEncoder(max_len=cfg["embed_max_len"], channels=args.channels,
                           global_channels=args.global_channels, embed_dim=args.embed_dim,
                           profile=None if args.profile is None else bool(args.profile))
        fit_kw = {k: v for k, v in (("epochs", args.epochs), ("n_train", args.n_train),
                                    ("approx_form", args.approx_form),
                                    ("learning_rate", args.learning_rate)) if v is not None}
        t = time.perf_counter()
        enc.fit(base, **fit_kw)
        res["training"] = {
            "seconds": time.perf_counter() - t, "epochs": enc.report.epochs_run,
            "neighbour_seconds": enc.report.neighbour_seconds, "n_threads": 1,
            "history": enc.report.history,
        }
        enc.save(enc_path)
        log.info("trained in %.0f s", res["training"]["seconds"])
    res["encoder"] = repr(enc)

    with thread_limit(1):
        t = time.perf_counter()
        xb = enc.encode(base)
        t_enc = time.perf_counter() - t
        t = time.perf_counter()
        xq = enc.encode(queries)
        t_q = time.perf_counter() - t
        res["embedding"] = {"strings_per_s": len(base) / t_enc, "seconds": t_enc,
                            "query_ms": 1e3 * t_q / len(queries)}
        log.info("embedded %d strings in %.1f s", len(base), t_enc)

        # -- recall against T (exact top-T in embedding space, then exact re-rank) --------
        if not args.e2e_only:
            recall_vs_t(res, enc, cfg, ds, base, queries, xb, xq, gt_d)

        # -- end to end: StringIndex against brute-force rapidfuzz -------------------------
        e2e = []
        # brute force is timed on the first nb queries only (it is slow), and per-query cost
        # varies with the query's length: the index is timed on those same queries for the ratio
        nb = min(len(queries), args.brute_queries or cfg["brute_queries"])
        for kind, params in (("hnsw", dict(M=16, ef_construction=200)), ("flat", {})):
            idx = StringIndex(encoder=enc, index=kind, **params)
            t = time.perf_counter()
            idx.add(base)  # embeds again: the build time holds the embedding time above
            res[f"index_build_seconds_{kind}"] = time.perf_counter() - t
            for T in (int(t) for t in args.e2e_ts.split(",")):
                t = time.perf_counter()
                r = idx.search(queries, 10, n_candidates=T)
                dt = time.perf_counter() - t
                rec = float(((r.scores <= gt_d[:, 9:10]).sum(1) / 10).mean())
                t = time.perf_counter()
                idx.search(queries[:nb], 10, n_candidates=T)
                qps_nb = nb / (time.perf_counter() - t)
                e2e.append({"index": kind, "T": T, "recall10": rec, "qps": len(queries) / dt,
                            "qps_brute_queries": qps_nb})
                log.info("StringIndex %s T=%d: recall@10 %.3f, %.1f q/s (%.1f on the first %d)",
                         kind, T, rec, len(queries) / dt, qps_nb, nb)
        res["string_index"] = e2e
        res["brute_queries"] = nb
        t = time.perf_counter()
        edit_distance_matrix(queries[:nb], base, workers=1)
        res["brute_force_qps"] = nb / (time.perf_counter() - t)
        log.info("brute force: %.2f q/s", res["brute_force_qps"])
        t = time.perf_counter()
        brute_with_cutoffs(queries[:nb], base, 10)
        res["brute_force_cutoff_qps"] = nb / (time.perf_counter() - t)
        log.info("brute force with cutoffs: %.2f q/s", res["brute_force_cutoff_qps"])

    (out_dir / f"{args.dataset}.json").write_text(json.dumps(res, indent=1))
    print(markdown(res))
    plot(res, ROOT / "docs" / "img" / f"strings-{args.dataset}.png")


def brute_with_cutoffs(queries, base, k, block=1024):
    """Brute force with the StringIndex's re-ranking trick: the whole base in base order,
    rapidfuzz score cutoffs tightened to the k-th best distance so far after each block."""
    return np.array([np.sort(distances_with_cutoff(q, base, k, block))[:k] for q in queries])


def recall_vs_t(res, enc, cfg, ds, base, queries, xb, xq, gt_d) -> None:
    """Exact top-T by L2 (CNN-ED) and by Hamming distance (CGK), each re-ranked exactly."""
    flat = FlatIndex(xb.shape[1], "l2")
    flat.add(xb)
    cand = flat.search(xq, max(TS)).ids
    res["recall_cnned"] = recall_curves(queries, base, cand, gt_d)
    log.info("CNN-ED recall: %s", res["recall_cnned"])
    cgk = CGKEncoder(max_len=cfg["embed_max_len"]).fit(base + ds.queries)
    t = time.perf_counter()
    cb, cq = cgk.encode(base), cgk.encode(queries)
    res["cgk_embed_strings_per_s"] = (len(base) + len(queries)) / (time.perf_counter() - t)
    cand_cgk, _ = hamming_search(cq, cb, max(TS))
    res["recall_cgk"] = recall_curves(queries, base, cand_cgk, gt_d)
    log.info("CGK recall: %s", res["recall_cgk"])


def markdown(res: dict) -> str:
    lines = [f"### {res['dataset']}", ""]
    tr = res["training"]
    if "seconds" in tr:
        lines.append(f"training: {tr['seconds']:.0f} s ({tr['epochs']} epochs, neighbour lists "
                     f"{tr['neighbour_seconds']:.0f} s, 1 thread); embedding: "
                     f"{res['embedding']['strings_per_s']:.0f} strings/s (1 thread; "
                     f"{res['embedding'].get('query_ms', 0):.2f} ms per query); CGK: "
                     f"{res.get('cgk_embed_strings_per_s', 0):.0f} strings/s")
    if "recall_cnned" in res:
        lines += ["", "| T | " + " | ".join(f"CNN-ED @{k} | CGK @{k}" for k in KS) + " |",
                  "|---:|" + "---:|" * (2 * len(KS))]
        for T in TS:
            a, b = res["recall_cnned"][T], res["recall_cgk"][T]
            lines.append(f"| {T} | " + " | ".join(f"{a[k]:.3f} | {b[k]:.3f}" for k in KS) + " |")
    bf = res["brute_force_qps"]
    bc = res.get("brute_force_cutoff_qps", float("nan"))
    nb = res.get("brute_queries", "the first")
    lines += ["", f"brute force on {nb} queries (rapidfuzz cdist, 1 thread): {bf:.2f} q/s; with "
              f"the index's cutoffs: {bc:.2f} q/s. The ratios compare the index on those same "
              "queries (q/s same queries); recall and q/s are over all queries.", "",
              "| index | T | recall@10 | q/s | q/s same queries | × brute force | "
              "× brute force with cutoffs |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for e in res["string_index"]:
        same = e.get("qps_brute_queries", e["qps"])  # older results: all queries
        lines.append(f"| {e.get('index', 'hnsw')} | {e['T']} | {e['recall10']:.3f} | "
                     f"{e['qps']:.1f} | {same:.1f} | {same / bf:.1f} | {same / bc:.1f} |")
    return "\n".join(lines)


def plot(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for k, style in zip(KS, ("-", "--", ":"), strict=True):
        for name, color in (("cnned", "C0"), ("cgk", "C3")) if "recall_cgk" in res else ():
            ys = [res[f"recall_{name}"][T][k] for T in TS]
            axes[0].plot(TS, ys, style, color=color, label=f"{name.upper()} top-{k}")
    axes[0].set(xscale="log", xlabel="T (candidates re-ranked)", ylabel="recall",
                title=f"{res['dataset']}: recall vs T")
    axes[0].legend(fontsize=7)
    for kind in ("hnsw", "flat"):
        e = [x for x in res["string_index"] if x.get("index", "hnsw") == kind]
        axes[1].plot([x["recall10"] for x in e], [x["qps"] for x in e], "o-",
                     label=f"StringIndex ({kind})")
    axes[1].axhline(res["brute_force_qps"], color="k", ls="--", label="brute force")
    axes[1].set(yscale="log", xlabel="recall@10", ylabel="queries/s (1 thread)",
                title="end to end")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=80)


if __name__ == "__main__":
    main()

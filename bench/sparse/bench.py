"""Sparse retrieval benchmark on real text (docs/bench/sparse.md): Webster's 1913 dictionary
(Debian's dict-gcide, 100,000+ passages, 1,000 held-out queries), one thread, the peers timed
in alternation with simsearch in one run.

    python -m bench.sparse.bench splade   # SPLADE vectors: SeismicIndex vs pyseismic-lsr vs the
                                          # exact inverted scan (sparse-flat)
    python -m bench.sparse.bench bm25     # BM25: the bm25 kind vs bm25s (same tokens, k1, b);
                                          # SeismicIndex on BM25 vectors
    python -m bench.sparse.bench churn    # 10% removed and as many added: recall vs a fresh build

The SPLADE vectors are encoded once (simsearch.text.SparseEncoder, the bundled SPLADE-tiny) and
cached beside the dataset. Raw results: bench/results/sparse/<what>.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import tempfile
import time
from pathlib import Path

import numpy as np

import simsearch as ss
from simsearch.datasets import cache_dir, load_texts
from simsearch.eval import alternated_best_times, markdown_table, thread_limit
from simsearch.sparse import BM25Index, SeismicIndex, SparseBatch, SparseFlatIndex, count_tokens

log = logging.getLogger("sparse_bench")
ROOT = Path(__file__).resolve().parents[2]
K = 10
#: (query_cut, heap_factor) settings swept for both Seismic implementations, cheapest first
GRID = ((3, 0.7), (5, 0.7), (5, 0.8), (8, 0.8), (10, 0.8), (10, 0.9), (15, 0.9), (20, 0.9),
        (20, 1.0), (30, 1.0))


def splade_vectors(ds) -> tuple[SparseBatch, SparseBatch]:
    """(documents, queries) encoded by SPLADE-tiny; cached by the dataset's key."""
    path = cache_dir() / f"{ds.key}-splade.npz"
    if not path.exists():
        from simsearch.text import SparseEncoder

        enc = SparseEncoder(max_length=128, batch_size=64)
        t = time.perf_counter()
        docs = enc.encode_documents(ds.base, progress=True)
        qs = enc.encode_queries(ds.queries)
        log.info("encoded %d passages in %.0f s", len(ds.base), time.perf_counter() - t)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".npz", delete=False) as f:
            np.savez(f, **{f"d_{k}": v for k, v in _arrays(docs).items()},
                     **{f"q_{k}": v for k, v in _arrays(qs).items()})
        Path(f.name).replace(path)
    z = np.load(path)
    return _batch(z, "d_"), _batch(z, "q_")


def _arrays(b: SparseBatch) -> dict:
    return {"indptr": b.indptr, "indices": b.indices, "values": b.values,
            "dim": np.array(b.dim)}


def _batch(z, p: str) -> SparseBatch:
    return SparseBatch(z[p + "indptr"], z[p + "indices"], z[p + "values"], int(z[p + "dim"]))


def recall(got: np.ndarray, truth: np.ndarray) -> float:
    hits = [len(set(g[g >= 0].tolist()) & set(t[t >= 0].tolist()))
            for g, t in zip(got, truth, strict=True)]
    return float(np.sum(hits) / max(1, (truth >= 0).sum()))


# -- pyseismic-lsr --------------------------------------------------------------------------


class PySeismic:
    """The Seismic authors' index (pyseismic-lsr), built from the same vectors; term ids as its
    token strings."""

    def __init__(self, docs: SparseBatch, n_postings: int, centroid_fraction: float,
                 summary_energy: float):
        import seismic

        self.seismic = seismic
        self.str = seismic.get_seismic_string()
        ds = (seismic.SeismicDatasetLV if docs.dim > 65_535 else seismic.SeismicDataset)()
        for r in range(len(docs)):
            t, v = docs.row(r)
            ds.add_document(str(r), t.astype(str).astype(self.str), v.astype(np.float32))
        cls = seismic.SeismicIndexLV if docs.dim > 65_535 else seismic.SeismicIndex
        self.index = cls.build_from_dataset(ds, n_postings=n_postings,
                                            centroid_fraction=centroid_fraction,
                                            summary_energy=summary_energy, num_threads=1)

    def prepare(self, q: SparseBatch):
        comps, vals = [], []
        for r in range(len(q)):
            t, v = q.row(r)
            comps.append(t.astype(str).astype(self.str))
            vals.append(v.astype(np.float32))
        return np.array([str(i) for i in range(len(q))], dtype=self.str), comps, vals

    def search(self, prepared, query_cut: int, heap_factor: float):
        qids, comps, vals = prepared
        return self.index.batch_search(qids, comps, vals, k=K, query_cut=query_cut,
                                       heap_factor=heap_factor, num_threads=1)

    @staticmethod
    def ids(results) -> np.ndarray:
        out = np.full((len(results), K), -1, np.int64)
        for r in results:  # by each answer's query id: the lists need not come in query order
            if r:
                got = [int(d) for _, _, d in r][:K]
                out[int(r[0][0]), : len(got)] = got
        return out

    def nbytes(self) -> int:
        with tempfile.TemporaryDirectory() as d:
            self.index.save(str(Path(d) / "index"))
            return sum(p.stat().st_size for p in Path(d).iterdir())


# -- the runs -------------------------------------------------------------------------------


def seismic_side_by_side(docs: SparseBatch, qs: SparseBatch, res: dict, label: str) -> None:
    """SeismicIndex and pyseismic-lsr over the same vectors and the same settings' grid, and
    the exact scan; recall against the exact answers."""
    flat = SparseFlatIndex(docs.dim)
    flat.add(docs)
    truth = flat.search(qs, K).ids
    params = dict(n_postings=1000, centroid_fraction=0.1, summary_energy=0.4)
    t = time.perf_counter()
    ours = SeismicIndex(docs.dim, **params)
    ours.add(docs)
    build_ours = time.perf_counter() - t
    t = time.perf_counter()
    peer = PySeismic(docs, **params)
    build_peer = time.perf_counter() - t
    prepared = peer.prepare(qs)
    rows = []
    for qc, hf in GRID:
        r_ours = recall(ours.search(qs, K, query_cut=qc, heap_factor=hf).ids, truth)
        r_peer = recall(peer.ids(peer.search(prepared, qc, hf)), truth)
        t_ours, t_peer, t_flat = alternated_best_times(
            [lambda: ours.search(qs, K, query_cut=qc, heap_factor=hf),  # noqa: B023
             lambda: peer.search(prepared, qc, hf),  # noqa: B023
             lambda: flat.search(qs, K)], rounds=3)
        rows.append({"query_cut": qc, "heap_factor": hf, "recall (simsearch)": r_ours,
                     "q/s (simsearch)": len(qs) / t_ours, "recall (pyseismic)": r_peer,
                     "q/s (pyseismic)": len(qs) / t_peer, "q/s (exact scan)": len(qs) / t_flat})
        log.info("%s", rows[-1])
    res[label] = {
        "n": len(docs), "nnz_per_doc": docs.nnz / len(docs), "nnz_per_query": qs.nnz / len(qs),
        "build_seconds": {"simsearch": build_ours, "pyseismic": build_peer},
        # in memory for simsearch; pyseismic-lsr's saved index (its serialized structures)
        "bytes_per_item": {"simsearch": ours.memory_bytes() / len(docs),
                           "simsearch (file)": len(ours.to_bytes()) / len(docs),
                           "pyseismic": peer.nbytes() / len(docs)},
        "rows": rows, "at_recall": at_recall(rows)}


def at_recall(rows: list[dict]) -> dict:
    """Each side's best q/s among the settings that reach recall 0.9 and 0.95."""
    out = {}
    for target in (0.9, 0.95):
        best = {}
        for side in ("simsearch", "pyseismic"):
            ok = [r[f"q/s ({side})"] for r in rows if r[f"recall ({side})"] >= target]
            best[side] = max(ok) if ok else None
        best["exact scan"] = float(np.median([r["q/s (exact scan)"] for r in rows]))
        out[str(target)] = best
    return out


def bm25_side_by_side(ds, res: dict, k1: float = 1.5, b: float = 0.75) -> None:
    """The bm25 kind against bm25s on bm25s's own tokens: the same top-10 scores, q/s."""
    import bm25s

    tokenizer = bm25s.tokenization.Tokenizer(stopwords="en")
    d_tok = tokenizer.tokenize(ds.base, return_as="ids", show_progress=False)
    q_tok = tokenizer.tokenize(ds.queries, return_as="ids", update_vocab=False,
                               show_progress=False)
    dim = len(tokenizer.get_vocab_dict())
    peer = bm25s.BM25(k1=k1, b=b, method="lucene")
    peer.index((d_tok, tokenizer.get_vocab_dict()), show_progress=False)
    fast = bm25s.BM25(k1=k1, b=b, method="lucene", backend="numba")  # its compiled scorer
    fast.index((d_tok, tokenizer.get_vocab_dict()), show_progress=False)
    fast.retrieve(q_tok[:2], k=K, show_progress=False, n_threads=1)  # compiled before timing
    ours = BM25Index(dim, k1=k1, b=b)
    ours.add(count_tokens(d_tok, dim))
    q = count_tokens(q_tok, dim)
    got = ours.search(q, K)
    want_ids, want_scores = peer.retrieve(q_tok, k=K, show_progress=False, n_threads=1)
    held = got.ids >= 0
    err = float(np.abs(np.sort(got.scores, axis=1)[:, ::-1][held]
                       - np.sort(want_scores, axis=1)[:, ::-1][held]).max())
    t_ours, t_peer, t_fast = alternated_best_times(
        [lambda: ours.search(q, K),
         lambda: peer.retrieve(q_tok, k=K, show_progress=False, n_threads=1),
         lambda: fast.retrieve(q_tok, k=K, show_progress=False, n_threads=1)], rounds=3)
    # BM25 as weighted vectors for Seismic: the items' saturated term frequencies, the
    # queries' idf weights (the inner product is the BM25 score of the corpus as it is now)
    docs, qv = ours.encode_documents(count_tokens(d_tok, dim)), ours.encode_queries(q)
    res["bm25"] = {"n": len(ds.base), "vocabulary": dim, "k1": k1, "b": b,
                   "max_score_difference": err,
                   "same_top10_ids": float((np.sort(got.ids, 1) == np.sort(want_ids, 1)).mean()),
                   "q/s (simsearch bm25)": len(ds.queries) / t_ours,
                   "q/s (bm25s numpy)": len(ds.queries) / t_peer,
                   "q/s (bm25s numba)": len(ds.queries) / t_fast,
                   "bytes_per_item (simsearch)": len(ours.to_bytes()) / len(ds.base)}
    log.info("%s", res["bm25"])
    seismic_side_by_side(docs, qv, res, "bm25-seismic")


def churn(docs: SparseBatch, qs: SparseBatch, res: dict, seed: int = 0) -> None:
    """10% of the items removed and as many added: recall at the same settings within 0.01 of
    an index built fresh on what is held."""
    rng = np.random.default_rng(seed)
    n = len(docs)
    first = rng.permutation(n)
    start, extra = first[: int(n * 0.9)], first[int(n * 0.9):]
    idx = SeismicIndex(docs.dim)
    idx.add(docs[np.sort(start)], ids=np.sort(start))
    gone = rng.choice(np.sort(start), len(extra), replace=False)
    idx.remove(gone)
    idx.add(docs[np.sort(extra)], ids=np.sort(extra))
    held = np.setdiff1d(np.arange(n), gone)
    fresh = SeismicIndex(docs.dim)
    fresh.add(docs[held], ids=held)
    flat = SparseFlatIndex(docs.dim)
    flat.add(docs[held], ids=held)
    truth = flat.search(qs, K).ids
    rows = []
    for qc, hf in ((5, 0.8), (10, 0.9), (20, 0.9)):
        t_idx, t_fresh = alternated_best_times(
            [lambda: idx.search(qs, K, query_cut=qc, heap_factor=hf),  # noqa: B023
             lambda: fresh.search(qs, K, query_cut=qc, heap_factor=hf)], rounds=3)  # noqa: B023
        rows.append({"query_cut": qc, "heap_factor": hf,
                     "recall (after churn)": recall(idx.search(qs, K, query_cut=qc,
                                                               heap_factor=hf).ids, truth),
                     "recall (fresh build)": recall(fresh.search(qs, K, query_cut=qc,
                                                                 heap_factor=hf).ids, truth),
                     "q/s (after churn)": len(qs) / t_idx, "q/s (fresh build)": len(qs) / t_fresh})
    res["churn"] = {"n": n, "removed": len(gone), "added": len(extra), "rows": rows}
    log.info("%s", res["churn"])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("what", choices=("splade", "bm25", "churn"))
    ap.add_argument("--n-queries", type=int, default=1000)
    ap.add_argument("--n-base", type=int, default=100_000, help="base passages (0: all)")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "sparse"))
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    ds = load_texts("gcide", n_queries=args.n_queries, n_base=args.n_base or None)
    res: dict = {"dataset": ds.key, "params": ds.params, "host": platform.node(),
                 "simsearch": ss.__version__, "n_base": len(ds.base)}
    log.info("gcide: %d passages, %d queries", len(ds.base), len(ds.queries))
    docs, qs = splade_vectors(ds) if args.what != "bm25" else (None, None)  # every core
    with thread_limit(1):
        if args.what == "bm25":
            bm25_side_by_side(ds, res)
        else:
            if args.what == "splade":
                seismic_side_by_side(docs, qs, res, "splade")
            else:
                churn(docs, qs, res)
    (out / f"{args.what}.json").write_text(json.dumps(res, indent=1))
    print(report(res))


def report(res: dict) -> str:
    parts = []
    for label in ("splade", "bm25-seismic"):
        if label in res:
            r = res[label]
            parts.append(f"{label}: {r['n']} items, {r['nnz_per_doc']:.0f} terms an item, "
                         f"{r['nnz_per_query']:.0f} a query; bytes/item simsearch "
                         f"{r['bytes_per_item']['simsearch']:.0f} in memory "
                         f"({r['bytes_per_item']['simsearch (file)']:.0f} saved), pyseismic "
                         f"{r['bytes_per_item']['pyseismic']:.0f} saved")
            parts.append(markdown_table(r["rows"], list(r["rows"][0])))
    if "bm25" in res:
        parts.append(markdown_table([res["bm25"]], list(res["bm25"])))
    if "churn" in res:
        parts.append(markdown_table(res["churn"]["rows"], list(res["churn"]["rows"][0])))
    return "\n\n".join(parts)


if __name__ == "__main__":
    main()

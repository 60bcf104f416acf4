"""Benchmark adapters for Simple-LSH / Norm-Ranging LSH and faiss IndexLSH with exact re-ranking.
Listed in ``ADAPTERS`` (bench/registry.py merges it)."""

from __future__ import annotations

from typing import Any

import faiss
import numpy as np

from simsearch.flat import topk_from_scores

from .adapters import Adapter, SimsearchAdapter


class LSHAdapter(SimsearchAdapter):
    """simsearch "simple-lsh" / "nr-lsh" through the Index API. Search: ``n_probe_items``,
    ``ranking``. Work: probed items and buckets per query."""

    metrics = ("ip",)

    def __init__(self, kind: str, metric: str, **build_params: Any):
        self.kind = kind
        self.name = f"simsearch-{kind}"
        super().__init__(metric, **build_params)


class FaissLSHRerank(Adapter):
    """faiss IndexLSH (sign random projections, ``n_bits``) over the Simple-LSH transform
    P(x) = [x / U, sqrt(1 - |x|^2 / U^2)] of the items (queries [q / |q|, 0]); the
    ``n_probe_items`` nearest codes by Hamming distance are re-ranked by exact inner product."""

    name = "faiss-lsh-rerank"
    metrics = ("ip",)

    def __init__(self, metric: str, n_bits: int = 32):
        super().__init__(metric, n_bits=n_bits)

    def fit(self, base: np.ndarray) -> None:
        self.x = np.ascontiguousarray(base, np.float32)
        nrm = np.linalg.norm(self.x, axis=1)
        U = float(nrm.max()) or 1.0
        tail = np.sqrt(np.maximum(1.0 - (nrm / U) ** 2, 0.0))
        P = np.ascontiguousarray(np.hstack([self.x / U, tail[:, None]]), np.float32)
        self.index = faiss.IndexLSH(P.shape[1], self.build_params["n_bits"], True, False)
        self.index.train(P)
        self.index.add(P)

    def query(self, q: np.ndarray, k: int, n_probe_items: int = 1000) -> np.ndarray:
        q = np.ascontiguousarray(q, np.float32)
        qt = np.hstack([q / np.linalg.norm(q, axis=1, keepdims=True), np.zeros((len(q), 1))])
        qt = np.ascontiguousarray(qt, np.float32)
        T = min(max(n_probe_items, k), self.index.ntotal)
        out = np.empty((len(q), k), np.int64)
        step = max(1, (1 << 21) // T)  # bound the gathered candidates to ~2M rows at a time
        for a in range(0, len(q), step):
            _, cand = self.index.search(qt[a : a + step], T)
            s = np.einsum("qd,qtd->qt", q[a : a + step], self.x[np.maximum(cand, 0)])
            s[cand < 0] = -np.inf
            pos, _ = topk_from_scores(s, k, True)
            out[a : a + step] = np.take_along_axis(cand, pos, axis=1)
        self._work = {"probed_items": float(T)}
        return out

    def index_bytes(self) -> int:
        return int(faiss.serialize_index(self.index).nbytes + self.x.nbytes)


def _kind(kind: str) -> type[LSHAdapter]:
    return type(f"LSH_{kind}", (LSHAdapter,), {
        "name": f"simsearch-{kind}",
        "__init__": lambda self, metric, **bp: LSHAdapter.__init__(self, kind, metric, **bp),
    })  # fmt: skip


ADAPTERS = {
    "simsearch-simple-lsh": _kind("simple-lsh"),
    "simsearch-nr-lsh": _kind("nr-lsh"),
    "faiss-lsh-rerank": FaissLSHRerank,
}

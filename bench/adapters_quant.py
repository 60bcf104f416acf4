"""Benchmark adapters for NEQ (simsearch "neq") and its equal-bits faiss baselines, both with an
optional exact re-rank of the scan's best ``rerank`` items so the QPS runner can sweep recall.
The paper's recall-within-top-T tables come from bench/quant/bench.py instead. Listed in
bench.registry."""

from __future__ import annotations

from typing import Any

import numpy as np

from simsearch.flat import topk_from_scores
from simsearch.quant import faiss_baseline, pad, padded_dim

from .adapters import Adapter, SimsearchAdapter


def _sample(base: np.ndarray, train_size: int, seed: int = 0) -> np.ndarray:
    if len(base) <= train_size:
        return base
    rng = np.random.default_rng(seed)
    return np.ascontiguousarray(base[np.sort(rng.choice(len(base), train_size, replace=False))])


class NEQAdapter(SimsearchAdapter):
    """simsearch NEQIndex, trained on a seeded sample of ``train_size`` rows, vectors kept for
    re-ranking. Build: ``base``, ``n_codebooks``, ... Search: ``rerank`` (0 = scan only)."""

    name = "simsearch-neq"
    kind = "neq"
    metrics = ("ip",)

    def __init__(self, metric: str, train_size: int = 65_536, **build_params: Any):
        super().__init__(metric, **build_params)
        self.train_size = train_size

    def fit(self, base: np.ndarray) -> None:
        import simsearch

        bp = {"keep_vectors": True, "progress": False} | self.build_params
        self.index = simsearch.create_index("neq", base.shape[1], self.metric, **bp)
        self.index.train(_sample(base, self.train_size))
        self.index.add(base)
        self._threads_param = True


class FaissQuantRerank(Adapter):
    """faiss IndexPQ / OPQ / IndexResidualQuantizer / IndexLocalSearchQuantizer with the
    inner-product metric at ``n_codebooks`` codebooks (NEQ's baseline at equal bits), then an
    exact re-rank of the best ``rerank`` items. Work: items re-ranked."""

    name = "faiss-quant-rerank"
    metrics = ("ip",)

    def __init__(self, metric: str, base: str = "pq", n_codebooks: int = 4,
                 train_size: int = 65_536, rq_beam_size: int = 1):  # fmt: skip
        super().__init__(metric, base=base, n_codebooks=n_codebooks, train_size=train_size,
                         rq_beam_size=rq_beam_size)  # fmt: skip

    def fit(self, base: np.ndarray) -> None:
        p = self.build_params
        self.x = np.ascontiguousarray(base, np.float32)
        self.d = padded_dim(base.shape[1], p["n_codebooks"], p["base"])
        self.index = faiss_baseline(p["base"], base.shape[1], p["n_codebooks"],
                                    rq_beam_size=p["rq_beam_size"])  # fmt: skip
        self.index.train(pad(_sample(self.x, p["train_size"]), self.d))
        self.index.add(pad(self.x, self.d))

    def query(self, q: np.ndarray, k: int, rerank: int = 0) -> np.ndarray:
        q = np.ascontiguousarray(q, np.float32)
        _, cand = self.index.search(pad(q, self.d), max(k, rerank))
        self._work = {"reranked": float(rerank)}
        if not rerank:
            return cand[:, :k].astype(np.int64)
        s = np.einsum("qd,qtd->qt", q, self.x[np.maximum(cand, 0)])
        s[cand < 0] = -np.inf
        pos, _ = topk_from_scores(s, k, True)
        return np.take_along_axis(cand, pos, axis=1).astype(np.int64)

    def index_bytes(self) -> int:
        import faiss

        return int(faiss.serialize_index(self.index).nbytes + self.x.nbytes)


ADAPTERS = {"simsearch-neq": NEQAdapter, "faiss-quant-rerank": FaissQuantRerank}

"""Benchmark adapters for ip-NSW+ (simsearch.graph) and an hnswlib adapter that counts its
distance computations. Listed in ``ADAPTERS`` (bench/registry.py merges it)."""

from __future__ import annotations

import numpy as np

from simsearch._hnswlib import hnswlib_graph
from simsearch.graph import _kernels as K

from .adapters import HnswlibRaw, SimsearchAdapter


class IPNSWPlusAdapter(SimsearchAdapter):
    """simsearch "ipnsw-plus" through the Index API. Build: the constructor's parameters.
    Search: ``ef``, ``angular_ef``; ``n_threads`` from the runner. Work per query: distance
    computations on both graphs ("distances" = "angular" + "ip"), counted by the kernel."""

    name = "ipnsw-plus"
    kind = "ipnsw-plus"
    metrics = ("ip",)

    def fit(self, base: np.ndarray) -> None:
        super().fit(base)
        self.build_seconds = self.index.build_seconds
        self.memory_bytes = self.index.memory_bytes()



class HnswlibCounted(HnswlibRaw):
    """hnswlib (as the "hnswlib" adapter) with a work counter: hnswlib does not export its
    distance count, so ``work()`` replays the last query batch on hnswlib's own graph
    (extracted from the index) with the same search procedure, outside the timed call, and
    reports the distance computations per query and the replay's agreement with hnswlib's
    answers (fraction of equal ids; 1.0 means the replay is the same search)."""

    name = "hnswlib-counted"
    metrics = ("ip", "cosine")  # the replay ranks by inner product (on unit vectors: cosine)

    def query(self, q: np.ndarray, k: int, ef: int = 64) -> np.ndarray:
        ids = super().query(q, k, ef=ef)
        self._last = (q, k, max(ef, k), ids)
        return ids

    def fit(self, base: np.ndarray) -> None:
        super().fit(base)
        self._base = self.prep(base)
        self._graph = None

    def work(self) -> dict[str, float] | None:
        if getattr(self, "_last", None) is None:
            return None
        q, k, ef, ids = self._last
        self._last = None
        if self._graph is None:
            self._graph = hnswlib_graph(self.index)
        g = self._graph
        pos, ndis = K.hnsw_query_batch(
            self.prep(q), k, ef, self._base, np.ones(1, np.float32), False, g["links0"],
            g["degree0"], g["upper_links"], g["upper_degree"], g["upper_start"], g["entry"],
            g["max_level"], np.zeros(len(self._base), np.int32),
        )  # fmt: skip
        same = [np.intersect1d(a, b).size / k for a, b in zip(pos, ids, strict=True)]
        agree = float(np.mean(same))
        return {"distances": float(ndis.mean()), "replay_agreement": agree}


ADAPTERS = {"ipnsw-plus": IPNSWPlusAdapter, "hnswlib-counted": HnswlibCounted}

"""Algorithm adapters for the benchmark runner, in the style of ann-benchmarks.

Every adapter is built with ``Adapter(metric, **build_params)``, then ``fit(base)``; ``query(q, k,
**search_params)`` answers a whole batch and returns int64 row ids of ``base`` (nq, k), best first.
Search parameters are passed per call, so one built index serves a whole sweep. ``n_threads`` (an
attribute the runner sets) is how many threads a query call may use; the runner also caps BLAS and
OpenMP pools around it (``simsearch.eval.thread_limit``).

A new algorithm plugs in with one line in :data:`ADAPTERS`; any ``simsearch`` index kind with
``simsearch_adapter("kind")``.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any, ClassVar

import faiss
import hnswlib
import numpy as np

import simsearch
from simsearch.eval import thread_limit
from simsearch.flat import topk_from_scores

_FAISS_METRIC = {
    "ip": faiss.METRIC_INNER_PRODUCT,
    "cosine": faiss.METRIC_INNER_PRODUCT,  # on unit vectors
    "l2": faiss.METRIC_L2,
}


def _unit(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x / np.linalg.norm(x, axis=1, keepdims=True), dtype=np.float32)


class Adapter:
    """Base adapter. Subclasses set ``name`` and implement ``fit``, ``query``, ``index_bytes``.

    ``exact``: the method returns the true top-k (the runner checks recall 1.0 for these).
    ``metrics``: the metrics the method supports.
    """

    name: ClassVar[str] = "abstract"
    exact: ClassVar[bool] = False
    metrics: ClassVar[tuple[str, ...]] = ("ip", "cosine", "l2")

    def __init__(self, metric: str, **build_params: Any):
        if metric not in self.metrics:
            raise ValueError(f"{self.name} supports metrics {list(self.metrics)}; got {metric!r}")
        self.metric = metric
        self.build_params = build_params
        self.n_threads = 1
        self._work: dict[str, float] | None = None

    def prep(self, x: np.ndarray) -> np.ndarray:
        """Raw libraries see unit vectors under "cosine" (counted in query time)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        return _unit(x) if self.metric == "cosine" else x

    def fit(self, base: np.ndarray) -> None:
        raise NotImplementedError

    def query(self, q: np.ndarray, k: int, **search_params: Any) -> np.ndarray:
        raise NotImplementedError

    def work(self) -> dict[str, float] | None:
        """The method's own work counters of the last ``query`` call, per query (e.g. distance
        computations), or None when the method does not count."""
        return self._work

    def index_bytes(self) -> int:
        raise NotImplementedError


# -- faiss ------------------------------------------------------------------------------------


class _Faiss(Adapter):
    index: faiss.Index

    def index_bytes(self) -> int:
        return int(faiss.serialize_index(self.index).nbytes)

    def _search(self, q: np.ndarray, k: int, params=None) -> np.ndarray:
        _, ids = self.index.search(self.prep(q), k, params=params)
        return ids.astype(np.int64, copy=False)


class FaissFlat(_Faiss):
    """Exact search: faiss IndexFlatIP / IndexFlatL2 (cosine = inner product on unit vectors)."""

    name = "faiss-flat"
    exact = True

    def fit(self, base: np.ndarray) -> None:
        d = base.shape[1]
        self.index = faiss.IndexFlatL2(d) if self.metric == "l2" else faiss.IndexFlatIP(d)
        self.index.add(self.prep(base))

    def query(self, q: np.ndarray, k: int) -> np.ndarray:
        self._work = {"distances": float(self.index.ntotal)}
        return self._search(q, k)


class FaissHNSW(_Faiss):
    """faiss IndexHNSWFlat. Build: ``M``, ``ef_construction``, ``n_threads`` (OpenMP threads of
    add; -1: the runner's). Search: ``ef`` (efSearch, passed per call through
    SearchParametersHNSW). Work: distance computations (hnsw_stats.ndis)."""

    name = "faiss-hnsw"

    def __init__(self, metric: str, M: int = 16, ef_construction: int = 200, n_threads: int = -1):
        super().__init__(metric, M=M, ef_construction=ef_construction, n_threads=n_threads)

    def fit(self, base: np.ndarray) -> None:
        p = self.build_params
        self.index = faiss.IndexHNSWFlat(base.shape[1], p["M"], _FAISS_METRIC[self.metric])
        self.index.hnsw.efConstruction = p["ef_construction"]
        with thread_limit(p["n_threads"] if p["n_threads"] > 0 else None):
            self.index.add(self.prep(base))

    def query(self, q: np.ndarray, k: int, ef: int = 64) -> np.ndarray:
        stats = faiss.cvar.hnsw_stats
        stats.reset()
        ids = self._search(q, k, faiss.SearchParametersHNSW(efSearch=max(ef, k)))
        self._work = {"distances": stats.ndis / len(q)}
        return ids


class FaissIVFPQ(_Faiss):
    """faiss IndexIVFPQ from ``index_factory("IVF{n_lists},PQ{m}x{nbits}np")``, trained on the
    base (or a seeded sample of ``train_size`` rows). Search: ``nprobe``. Work: codes scanned."""

    name = "faiss-ivfpq"

    def __init__(
        self,
        metric: str,
        n_lists: int = 1024,
        m: int = 16,
        nbits: int = 8,
        train_size: int | None = None,
        seed: int = 0,
    ):
        super().__init__(
            metric, n_lists=n_lists, m=m, nbits=nbits, train_size=train_size, seed=seed
        )

    def fit(self, base: np.ndarray) -> None:
        p = self.build_params
        spec = f"IVF{p['n_lists']},PQ{p['m']}x{p['nbits']}np"
        self.index = faiss.index_factory(base.shape[1], spec, _FAISS_METRIC[self.metric])
        x = self.prep(base)
        train = x
        if p["train_size"] and p["train_size"] < len(x):
            rng = np.random.default_rng(p["seed"])
            train = x[np.sort(rng.choice(len(x), p["train_size"], replace=False))]
        with thread_limit(1):  # k-means here trains faster on one thread than on two
            self.index.train(train)
        self.index.add(x)

    def query(self, q: np.ndarray, k: int, nprobe: int = 1) -> np.ndarray:
        stats = faiss.cvar.indexIVF_stats
        stats.reset()
        ids = self._search(q, k, faiss.SearchParametersIVF(nprobe=nprobe))
        self._work = {"codes_scanned": stats.ndis / len(q)}
        return ids


# -- hnswlib ----------------------------------------------------------------------------------


class HnswlibRaw(Adapter):
    """Raw ``hnswlib.Index`` (space "ip" on unit vectors for "cosine"). Build: ``M``,
    ``ef_construction``, ``seed``, ``n_threads`` (threads of add_items; 1 gives a deterministic
    graph). Search: ``ef`` (set with set_ef before the call; raised to k). No work counter."""

    name = "hnswlib"

    def __init__(
        self,
        metric: str,
        M: int = 16,
        ef_construction: int = 200,
        seed: int = 100,
        n_threads: int = -1,
    ):
        super().__init__(
            metric, M=M, ef_construction=ef_construction, seed=seed, n_threads=n_threads
        )

    def fit(self, base: np.ndarray) -> None:
        p = self.build_params
        space = {"ip": "ip", "cosine": "ip", "l2": "l2"}[self.metric]
        self.index = hnswlib.Index(space=space, dim=base.shape[1])
        self.index.init_index(
            max_elements=len(base),
            M=p["M"],
            ef_construction=p["ef_construction"],
            random_seed=p["seed"],
        )
        self.index.add_items(self.prep(base), np.arange(len(base)), num_threads=p["n_threads"])

    def query(self, q: np.ndarray, k: int, ef: int = 64) -> np.ndarray:
        self.index.set_ef(max(ef, k))
        ids, _ = self.index.knn_query(self.prep(q), k=k, num_threads=self.n_threads)
        return ids.astype(np.int64, copy=False)

    def index_bytes(self) -> int:
        return int(self.index.index_file_size())


# -- the trivial MIPS floor -------------------------------------------------------------------


class NormScan(Adapter):
    """The MIPS floor (docs/benchmarks.md): scan the ``n_items`` largest-norm items, re-rank
    exactly by inner product. A method that cannot beat it on long-tailed data proves nothing."""

    name = "norm-scan"
    metrics = ("ip",)

    def fit(self, base: np.ndarray) -> None:
        self.order = np.argsort(-np.linalg.norm(base, axis=1), kind="stable")
        self.x = np.ascontiguousarray(base[self.order], dtype=np.float32)

    def query(self, q: np.ndarray, k: int, n_items: int = 1000) -> np.ndarray:
        t = min(n_items, len(self.x))
        pos, _ = topk_from_scores(self.prep(q) @ self.x[:t].T, k, True)
        self._work = {"distances": float(t)}
        return np.where(pos >= 0, self.order[np.maximum(pos, 0)], -1)

    def index_bytes(self) -> int:
        return int(self.x.nbytes + self.order.nbytes)


# -- simsearch --------------------------------------------------------------------------------


class SimsearchAdapter(Adapter):
    """Any simsearch index kind through the public Index API (``create_index``, ``train``,
    ``add``, ``search``); build params go to the constructor, search params to ``search``. The
    per-call ``n_threads`` is passed when the index accepts it. Work counters are read from
    ``SearchResult.stats`` (a dict) when an index provides one."""

    kind: ClassVar[str] = "flat"

    def fit(self, base: np.ndarray) -> None:
        self.index = simsearch.create_index(
            self.kind, base.shape[1], self.metric, **self.build_params
        )
        self.index.train(base)
        self.index.add(base)
        self._threads_param = "n_threads" in self.index.capabilities.search_params

    def query(self, q: np.ndarray, k: int, **search_params: Any) -> np.ndarray:
        if self._threads_param:
            search_params["n_threads"] = self.n_threads
        res = self.index.search(q, k, **search_params)
        stats = getattr(res, "stats", None)
        self._work = {key: v / len(q) for key, v in stats.items()} if stats else None
        return res.ids

    def index_bytes(self) -> int:
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "index.sim")
            self.index.save(path)
            return os.path.getsize(path)


def simsearch_adapter(kind: str, *, exact: bool = False) -> type[SimsearchAdapter]:
    """An adapter class for the simsearch index kind ``kind`` (see ``simsearch.index_kinds()``)."""
    return type(
        f"Simsearch_{kind}",
        (SimsearchAdapter,),
        {
            "name": f"simsearch-{kind}",
            "kind": kind,
            "exact": exact,
            "__doc__": f"simsearch index kind {kind!r} through the Index API.",
        },
    )


#: the core adapters (bench.registry adds each algorithm family's)
ADAPTERS: dict[str, type[Adapter]] = {
    "faiss-flat": FaissFlat,
    "faiss-hnsw": FaissHNSW,
    "faiss-ivfpq": FaissIVFPQ,
    "hnswlib": HnswlibRaw,
    "norm-scan": NormScan,
    "simsearch-flat": simsearch_adapter("flat", exact=True),
    "simsearch-hnsw": simsearch_adapter("hnsw"),
}

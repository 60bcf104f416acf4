"""SeismicIndex: approximate sparse MIPS by Seismic (docs/sparse.md, "Seismic"), written from the
paper: Bruch, Nardini, Rulli, Venturini, "Efficient Inverted Indexes for Approximate Retrieval
over Learned Sparse Representations" (SIGIR 2024).

Per term, its posting list pruned to the ``n_postings`` largest weights, clustered into blocks
of similar documents, each block summarised by the coordinate-wise maximum of its documents
(pruned to ``summary_energy`` of its mass, 8-bit codes). A query visits its ``query_cut``
heaviest terms' blocks whose summary bound reaches ``heap_factor`` times the k-th best score
so far (the authors' convention) and scores their documents exactly from the forward rows.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._simd import seismic_search
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..index import SearchResult, check_int, register
from ._kernels import term_blocks
from .batch import SparseBatch
from .flat import SparseStore

#: the vocabulary a Seismic index holds a dense query vector of (float32 a term)
MAX_VOCABULARY = 1 << 26


@register("sparse-seismic")
class SeismicIndex(SparseStore):
    """Seismic over sparse items (``dim``: the vocabulary). Build parameters: ``n_postings``
    (the paper's λ: entries kept per posting list, default 1,000), ``centroid_fraction`` (blocks
    per list as a share of its kept entries, the paper's β / λ, default 0.1), ``summary_energy``
    (the paper's α: the share of a block's mass its summary keeps, default 0.4), ``seed``.
    Search parameters: ``query_cut`` (the query's heaviest terms visited, default 10),
    ``heap_factor`` (a block is visited when its bound reaches this times the k-th best score,
    as in the authors' pyseismic-lsr; default 0.9: lower visits more).

    Items added after the last build are scored exactly, every one, until they reach an eighth
    of the built ones (or 4,096), when the blocks are built again; removed items are skipped and
    dropped at the next build. So membership is always exact; only the ranking of built items
    is approximate.

    >>> import simsearch as ss
    >>> idx = ss.SeismicIndex(10)
    >>> idx.add([([1, 4], [0.5, 2.0]), ([4, 7], [1.0, 1.0]), ([2], [3.0])]).tolist()
    [0, 1, 2]
    >>> r = idx.search(([4, 7], [1.0, 0.5]), k=2, query_cut=2)
    >>> r.ids.tolist(), r.scores.tolist()
    ([[0, 1]], [[2.0, 1.5]])
    """

    capabilities = Capabilities(items="sparse",
                                search_params=frozenset({"query_cut", "heap_factor"}))

    def __init__(self, dim: int, metric: str = "ip", n_postings: int = 1000,
                 centroid_fraction: float = 0.1, summary_energy: float = 0.4, seed: int = 0):
        n_postings = check_int("n_postings", n_postings, 1, 1 << 24)
        for name, v in (("centroid_fraction", centroid_fraction),
                        ("summary_energy", summary_energy)):
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                raise InvalidParameterError(f"{name} must be a number in (0, 1]; got {v!r}")
        seed = check_int("seed", seed, 0, (1 << 31) - 1)
        if isinstance(dim, int) and dim > MAX_VOCABULARY:
            raise InvalidParameterError(f"dim (the vocabulary) must be at most {MAX_VOCABULARY} "
                                        f"for sparse-seismic; got {dim}")
        super().__init__(dim, metric, n_postings=n_postings,
                         centroid_fraction=float(centroid_fraction),
                         summary_energy=float(summary_energy), seed=seed)

    def _build_lists(self, n_main: int) -> None:
        """The blocks and summaries of the first ``n_main`` positions."""
        super()._build_lists(n_main)  # the posting lists: the exact scan a narrow filter takes
        p = self._params
        post = self._post
        fp, fi, fv = self._fp, self._fi, self._fv
        scratch = np.zeros(self.dim, np.float32)
        mark = np.zeros(self.dim, bool)
        terms = np.empty(self.dim, np.uint32)
        tb = np.zeros(self.dim + 1, np.int64)  # each term's first block
        docs_parts, dstarts, sparts_t, sparts_c, scales, sstarts = [], [], [], [], [], []
        n_blocks = n_docs = n_sum = 0
        for t in np.flatnonzero(np.diff(post[0])).tolist():
            a, b = post[0][t], post[0][t + 1]
            kept = min(b - a, p["n_postings"])
            nb = max(1, math.ceil(kept * p["centroid_fraction"]))
            order, starts, ss, st, sc, scl = term_blocks(
                post[1][a:b], post[2][a:b], p["n_postings"], nb, fp, fi, fv,
                np.float32(p["summary_energy"]), p["seed"] + t, scratch, mark, terms)
            tb[t + 1] = starts.size - 1
            docs_parts.append(order)
            dstarts.append(starts[:-1] + n_docs)
            sparts_t.append(st)
            sparts_c.append(sc)
            scales.append(scl)
            sstarts.append(ss[:-1] + n_sum)
            n_blocks += starts.size - 1
            n_docs += order.size
            n_sum += st.size
        cat = (lambda xs, dt: np.concatenate(xs).astype(dt) if xs else np.empty(0, dt))
        self._blocks = (np.cumsum(tb), np.append(cat(dstarts, np.int64), n_docs),
                        cat(docs_parts, np.int64), np.append(cat(sstarts, np.int64), n_sum),
                        cat(sparts_t, np.uint32), cat(sparts_c, np.uint8),
                        cat(scales, np.float32))

    def _scan(self, q: SparseBatch, k: int, ok: np.ndarray, query_cut: int = 10,
              heap_factor: float = 0.9) -> SearchResult:
        query_cut = check_int("query_cut", query_cut, 1, 1 << 20)
        if isinstance(heap_factor, bool) or not isinstance(heap_factor, (int, float)) or \
                not 0 < heap_factor <= 10:
            raise InvalidParameterError(
                f"heap_factor must be a number in (0, 10]; got {heap_factor!r}")
        tb, bdp, bd, sp_, st, sc, scl = self._blocks
        ids, scores = seismic_search(
            q.indptr, q.indices, q.values, query_cut, heap_factor, tb, bdp, bd,
            sp_, st, sc, scl, self._n_main, self._fp, self._fi, self._fv, self._pos_ids,
            ok.view(np.uint8), k, self.dim)
        return SearchResult(ids, scores)

    def _scan_filtered(self, q: SparseBatch, k: int, ok: np.ndarray,
                       **params: Any) -> SearchResult:
        """A filter that leaves fewer than ``32 k`` items takes the exact scan of them (the walk
        would find too few of them)."""
        if ok.sum() < 32 * k:
            return self._exact(q, k, ok)
        return self._scan(q, k, ok, **params)

"""Norm-ordered scans for maximum inner product search: NormScanIndex (one order over all items)
and NormIVFIndex (the same order inside inverted lists of directions).

For a query q and an item x, q·x <= |q| |x| (Cauchy–Schwarz). Items are kept sorted by |x|, largest
first; after a block, a query whose k-th best score is above |q| times the largest norm not yet
scanned has its exact answer. On data whose norms have a long tail (recommender embeddings, the
MIPS benchmarks) that happens after a few percent of the items, and a batch of queries needs one
matrix product per block for the queries still active. ``max_items`` bounds the scan per call for
an approximate answer (the norm-first scan of docs/benchmarks.md).

NormIVFIndex applies the same stop inside each list of a spherical k-means partition: a query
visits its ``n_probe`` best lists (ranked by the list's largest norm times q·c) and leaves each
as soon as |q| times the next norm cannot beat its k-th best. The answers' items are large and
close to the query's direction, so each visited list is left after its first few dozen items.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._kernels import heap_finish, heap_push_block, scan_norm_lists, scan_norm_lists_parallel
from ._lists import assign, rank, train_centroids
from ._numba_util import kernel_threads
from .index import Index, SearchResult, as_matrix, check_int, check_k, check_threads, register

_EVERY_ITEM = np.empty(0, np.uint8)  # no filter: the kernels' empty mask
_FIRST_BLOCK = 256  # blocks double up to _MAX_BLOCK: early stops stay cheap, late ones few calls
_MAX_BLOCK = 16384


@register("norm-scan")
class NormScanIndex(Index):
    """Exact MIPS by a norm-ordered scan with a Cauchy–Schwarz stop (metric "ip" only).

    Search parameter: ``max_items`` (scan at most this many items, largest norms first; default
    all, and then the answer equals FlatIndex's, ties to the smaller id). ``scan_fraction(q, k)``
    tells how much of the data a search reads before it can stop.
    """

    metrics = ("ip",)
    search_params = frozenset({"max_items"})

    def __init__(self, dim: int, metric: str = "ip"):
        super().__init__(dim, metric)
        self._x = np.empty((0, dim), np.float32)
        self._ids = np.empty(0, np.int64)
        self._norms = np.empty(0, np.float32)

    def _store(self, x: np.ndarray, ids: np.ndarray) -> None:
        norms = np.linalg.norm(x, axis=1).astype(np.float32)
        order = np.lexsort((ids, -norms))  # largest norm first; equal norms by id
        self._x = np.ascontiguousarray(x[order])
        self._ids = ids[order]
        self._norms = norms[order]

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        self._store(np.concatenate([self._x, x]), np.concatenate([self._ids, ids]))

    def _remove(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self._ids, ids)
        self._x, self._ids, self._norms = self._x[keep], self._ids[keep], self._norms[keep]

    def _search(self, q: np.ndarray, k: int, max_items: int | None = None) -> SearchResult:
        return self._scan(q, k, max_items)[0]

    # filtered search: allowed rows gathered in norm order keep the stop (docs/filters.md)
    def _exact_under(self, params: dict) -> bool:
        return params.get("max_items") is None

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        return self._ids, self._x

    def _traversal_reads(self, k: int, params: dict) -> float:
        return float(min(len(self), params["max_items"]))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        n = len(self)
        return min(n, int(np.ceil(2 * k * w))), {
            "max_items": min(n, int(np.ceil(params["max_items"] * w)))}

    def _exact_allowed(self, q: np.ndarray, k: int, ids: np.ndarray) -> tuple:
        pos = np.sort(self._positions_of(ids))  # norm order
        r = self._scan(q, min(k, ids.size), None, (self._x[pos], self._ids[pos],
                                                    self._norms[pos]))[0]
        return r.ids, r.scores

    def scan_fraction(self, q: Any, k: int, max_items: int | None = None) -> float:
        """The fraction of the items a search of q scans before every query stops (a measure
        of how much the norm tail helps on this data)."""
        q = as_matrix(q, self.dim, self.metric, "queries")
        with self._lock.read():
            n = len(self)
            if not n or not q.shape[0]:
                return 0.0
            _, scanned = self._scan(q, min(check_k(k), n), max_items)
            return float(scanned.mean() / n)

    def _exact_denied(self, q: np.ndarray, k: int, filt) -> tuple:
        """Deny lists skipped inside the scan (their scores set to -inf block by block), so the
        stop comes as early as the allowed items allow."""
        held = [d[self._idset.contains(d)] for d in (filt.deny_of(i) for i in range(len(q)))]
        pos = [self._positions_of(d) for d in held]
        skip = (np.repeat(np.arange(len(q)), [p.size for p in pos]),
                np.concatenate(pos) if pos else np.empty(0, np.int64))
        order = np.argsort(skip[1], kind="stable")
        r = self._scan(q, k, None, skip=(skip[0][order], skip[1][order]))[0]
        return r.ids, r.scores

    def _scan(self, q: np.ndarray, k: int, max_items: int | None, rows: tuple | None = None,
              skip: tuple | None = None):
        """(result, items scanned per query), over ``rows`` = (x, ids, norms) in norm order
        (default: every item), leaving out the (query, position) pairs ``skip`` (sorted by
        position)."""
        x, ids, norms = rows if rows is not None else (self._x, self._ids, self._norms)
        n = x.shape[0]
        budget = n if max_items is None else min(check_int("max_items", max_items, 1), n)
        nq = q.shape[0]
        heap_s = np.full((nq, k), -np.inf, np.float32)
        heap_i = np.full((nq, k), -1, np.int64)
        sizes = np.zeros(nq, np.int64)
        scanned = np.zeros(nq, np.int64)
        qn = np.linalg.norm(q, axis=1).astype(np.float32)
        active = np.arange(nq, dtype=np.int64)
        start, block = 0, _FIRST_BLOCK
        while start < budget and active.size:
            end = min(start + block, budget)
            qa = q if active.size == nq else q[active]
            sc = qa @ x[start:end].T
            if skip is not None:
                lo, hi = np.searchsorted(skip[1], [start, end])
                if hi > lo:
                    slot = np.full(nq, -1, np.int64)
                    slot[active] = np.arange(active.size)
                    r_, p_ = slot[skip[0][lo:hi]], skip[1][lo:hi] - start
                    sc[r_[r_ >= 0], p_[r_ >= 0]] = -np.inf
            heap_push_block(sc, ids[start:end], active, heap_s, heap_i, sizes)
            scanned[active] = end
            if end < budget:
                # the best any unscanned item can score is |q| * (largest norm left); a full heap
                # whose worst is strictly above it is final (strict: a tie could be a smaller id)
                full = sizes[active] == k
                done = full & (heap_s[active, 0] > qn[active] * norms[end])
                if done.any():
                    active = active[~done]
            start, block = end, min(2 * block, _MAX_BLOCK)
        heap_finish(heap_s, heap_i, sizes)
        if skip is not None:
            heap_i[np.isneginf(heap_s)] = -1  # a skipped item that filled a short heap
        return SearchResult(heap_i, heap_s), scanned

    def _get_state(self):
        return {}, {"x": self._x, "ids": self._ids}

    def _set_state(self, meta, arrays):
        self._store(np.array(arrays["x"], np.float32), np.array(arrays["ids"], np.int64))


@register("norm-ivf")
class NormIVFIndex(Index):
    """MIPS over inverted lists of directions, each scanned by decreasing norm with the
    Cauchy–Schwarz stop (metric "ip" only; train first).

    Build: ``n_lists`` (default: the square root of the training rows), ``seed``. Search:
    ``n_probe`` lists per query (default all: then the answer is exact, as FlatIndex's up to
    float rounding), ``n_threads`` (1; -1 for all cores: a batch's queries spread over numba
    threads). Within the visited lists the answer is exact; recall grows with n_probe.
    """

    metrics = ("ip",)
    search_params = frozenset({"n_probe", "n_threads"})
    needs_training = True

    def __init__(self, dim: int, metric: str = "ip", n_lists: int | None = None, seed: int = 0):
        if n_lists is not None:
            check_int("n_lists", n_lists, 1, 1 << 20)
        check_int("seed", seed, 0, 2**31 - 1)
        super().__init__(dim, metric, n_lists=n_lists, seed=seed)
        self._centroids = np.empty((0, dim), np.float32)
        self._store(np.empty((0, dim), np.float32), np.empty(0, np.int64), np.empty(0, np.int64))

    @property
    def n_lists(self) -> int:
        return self._centroids.shape[0]

    def _train(self, x: np.ndarray) -> None:
        n_lists = self._params["n_lists"] or max(1, round(np.sqrt(x.shape[0])))
        self._centroids = train_centroids(x, n_lists, self._params["seed"])
        self._store(self._x, self._ids, np.empty(0, np.int64))

    def _store(self, x: np.ndarray, ids: np.ndarray, lists: np.ndarray) -> None:
        norms = np.linalg.norm(x, axis=1).astype(np.float32)
        order = np.lexsort((ids, -norms, lists))  # by list, then largest norm, then id
        self._x = np.ascontiguousarray(x[order])
        self._ids, self._norms, self._lists = ids[order], norms[order], lists[order]
        self._offsets = np.zeros(self.n_lists + 1, np.int64)
        np.cumsum(np.bincount(lists, minlength=self.n_lists), out=self._offsets[1:])
        # a list's largest norm is its first; an empty list gets 0 (never worth a visit)
        self._list_norm = np.zeros(self.n_lists, np.float32)
        has = np.diff(self._offsets) > 0
        self._list_norm[has] = self._norms[self._offsets[:-1][has]]

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        self._store(np.concatenate([self._x, x]), np.concatenate([self._ids, ids]),
                    np.concatenate([self._lists, assign(x, self._centroids)]))

    def _remove(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self._ids, ids)
        self._store(self._x[keep], self._ids[keep], self._lists[keep])

    def _search(self, q: np.ndarray, k: int, n_probe: int | None = None,
                n_threads: int = 1) -> SearchResult:
        return self._scan(q, k, n_probe, n_threads)[0]

    def _filtered_traversal(self, q, k, filt, params):
        """A filter shared by the batch is skipped inside the lists (a mask per position)."""
        if not filt.shared:
            return None
        allowed = np.zeros(len(self), np.uint8) if filt.allow is not None \
            else np.ones(len(self), np.uint8)
        for ids, v in ((filt.allow, 1), (filt.deny, 0)):
            if ids is not None and ids.size:
                allowed[self._positions_of(ids[self._idset.contains(ids)])] = v
        r = self._scan(q, k, params.get("n_probe"), params.get("n_threads", 1), allowed)[0]
        return r.ids, r.scores

    # filtered search (docs/filters.md): every list visited is exact; fewer lists are widened
    def _exact_under(self, params: dict) -> bool:
        n_probe = params.get("n_probe")
        return n_probe is None or n_probe >= self.n_lists

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        return self._ids, self._x

    def _traversal_reads(self, k: int, params: dict) -> float:
        return len(self) * min(1.0, params["n_probe"] / max(self.n_lists, 1))

    def scored_fraction(self, q: Any, k: int, n_probe: int | None = None) -> float:
        """The mean fraction of the items a search of q scores (the rest are skipped by the
        lists not visited and by the stop within each visited list)."""
        q = as_matrix(q, self.dim, self.metric, "queries")
        with self._lock.read():
            if not len(self) or not q.shape[0]:
                return 0.0
            return float(self._scan(q, min(check_k(k), len(self)), n_probe)[1].mean() / len(self))

    def _scan(self, q: np.ndarray, k: int, n_probe: int | None, n_threads: int = 1,
              allowed: np.ndarray = _EVERY_ITEM):
        n_probe = self.n_lists if n_probe is None else check_int("n_probe", n_probe, 1)
        n_threads = check_threads(n_threads)
        if n_threads == 1 or q.shape[0] == 1:
            return self._scan_lists(q, k, n_probe, scan_norm_lists, allowed)
        with kernel_threads(n_threads):  # around the ranking product too (_numba_util)
            return self._scan_lists(q, k, n_probe, scan_norm_lists_parallel, allowed)

    def _scan_lists(self, q, k, n_probe, kernel, allowed):
        # visiting the best lists first raises the k-th best early, so later lists stop sooner
        probes = rank(q, self._centroids, self._list_norm, min(n_probe, self.n_lists),
                      best_first=True)
        qn = np.linalg.norm(q, axis=1).astype(np.float32)
        ids, scores, scored = kernel(q, qn, self._x, self._norms, self._ids, self._offsets,
                                     probes, k, allowed)
        return SearchResult(ids, scores), scored

    def _get_state(self):
        return {}, {"x": self._x, "ids": self._ids, "lists": self._lists,
                    "centroids": self._centroids}

    def _set_state(self, meta, arrays):
        self._centroids = np.array(arrays["centroids"], np.float32)
        self._store(np.array(arrays["x"], np.float32), np.array(arrays["ids"], np.int64),
                    np.array(arrays["lists"], np.int64))

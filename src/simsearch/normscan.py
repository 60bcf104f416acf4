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

Writes do not re-sort: an add appends to a small unsorted tail that every search scores in full,
and the tail is merged into the sorted store only when it passes an eighth of it (at least
_TAIL_MIN items), so an add costs O(its own items) amortized instead of a copy of the index.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._kernels import heap_finish, heap_push_block, scan_norm_lists, scan_norm_lists_parallel
from ._lists import assign, rank, train_centroids
from ._numba_util import kernel_threads
from .capabilities import Capabilities
from .index import (
    Index,
    SearchResult,
    as_matrix,
    check_int,
    check_k,
    check_restored,
    check_threads,
    register,
)
from .planner import FilterPlanner

_EVERY_ITEM = np.empty(0, np.uint8)  # no filter: the kernels' empty mask
_TAIL_MIN = 4096  # the tail merges past max(_TAIL_MIN, sorted items / 8)
_FIRST_BLOCK = 256  # blocks double up to _MAX_BLOCK: early stops stay cheap, late ones few calls
_MAX_BLOCK = 16384


class _Tail:
    """Rows appended since the last merge, unsorted, with spare capacity (appends copy only new
    rows). ``lists`` carries NormIVF's list of each row (unused by NormScan)."""

    def __init__(self, dim: int):
        self.dim = dim
        self.clear()

    def append(self, x: np.ndarray, ids: np.ndarray, lists: np.ndarray | None = None) -> None:
        n, m = self.n, x.shape[0]
        if n + m > self.x.shape[0]:
            cap = max(2 * (n + m), 64)
            for name in ("x", "ids", "norms", "lists"):
                old = getattr(self, name)
                new = np.empty((cap, *old.shape[1:]), old.dtype)
                new[:n] = old[:n]
                setattr(self, name, new)
        self.x[n : n + m] = x
        self.ids[n : n + m] = ids
        self.norms[n : n + m] = np.linalg.norm(x, axis=1)
        if lists is not None:
            self.lists[n : n + m] = lists
        self.n = n + m

    def view(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        n = self.n
        return self.x[:n], self.ids[:n], self.norms[:n], self.lists[:n]

    def keep(self, mask: np.ndarray) -> None:
        x, ids, norms, lists = self.view()
        m = int(mask.sum())
        self.x[:m], self.ids[:m], self.norms[:m] = x[mask], ids[mask], norms[mask]
        if self.lists.shape[0]:
            self.lists[:m] = lists[mask]
        self.n = m

    def clear(self) -> None:
        """Empty, its capacity given back (a bulk load passes through here: twice its rows)."""
        self.n = 0
        self.x = np.empty((0, self.dim), np.float32)
        self.ids = np.empty(0, np.int64)
        self.norms = np.empty(0, np.float32)
        self.lists = np.empty(0, np.int64)

    def nbytes(self) -> int:
        return sum(a.nbytes for a in (self.x, self.ids, self.norms, self.lists))

    def full(self, sorted_items: int) -> bool:
        """Time to merge: past the threshold, or the first rows of an empty store (a bulk load
        goes straight to the sorted order, which a budgeted scan relies on)."""
        return self.n > max(_TAIL_MIN, sorted_items // 8) or not sorted_items


def _joined(idx, arrays: tuple) -> tuple:
    """``arrays`` (the sorted items' columns) each followed by the tail's, cached per version of
    the index (searches share it; a write makes a new version)."""
    tail = idx._tail
    if not tail.n:
        return arrays
    cache = idx.__dict__.get("_joined")
    if cache is None or cache[0] != idx._version:
        cache = (idx._version, tuple(np.concatenate([a, b]) for a, b in
                                     zip(arrays, tail.view(), strict=False)))
        idx._joined = cache  # two readers may both build it: benign
    return cache[1]


def _as_heaps(scores: np.ndarray, ids: np.ndarray, sizes: np.ndarray):
    """Best-first rows as worst-at-root heaps (heap_push_block's layout): a row's m entries
    sorted best first, reversed, are a valid heap; the padding stays behind them."""
    j = np.arange(scores.shape[1])[None, :]
    order = np.where(j < sizes[:, None], sizes[:, None] - 1 - j, j)
    return (np.take_along_axis(scores, order, 1).copy(),
            np.take_along_axis(ids, order, 1).copy())


def _push_tail(q, tail, heap_s, heap_i, sizes, hide=None):
    """Score every tail row for every query into the heaps; ``hide`` (nq, t) bool: pairs left
    out (a filter's, or rows outside the lists a query visits)."""
    x, ids = tail.view()[:2]
    if not x.shape[0]:
        return
    sc = q @ x.T
    if hide is not None:
        sc[hide] = -np.inf
    heap_push_block(sc, ids, np.arange(q.shape[0], dtype=np.int64), heap_s, heap_i, sizes)


@register("norm-scan")
class NormScanIndex(FilterPlanner, Index):
    """Exact MIPS by a norm-ordered scan with a Cauchy–Schwarz stop (metric "ip" only).

    Search parameter: ``max_items`` (scan at most this many items, largest norms first; default
    all, and then the answer equals FlatIndex's, ties to the smaller id). ``scan_fraction(q, k)``
    tells how much of the data a search reads before it can stop.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx, ref = ss.NormScanIndex(16), ss.FlatIndex(16, "ip")   # metric "ip"
    >>> _ = idx.add(x), ref.add(x)
    >>> bool((idx.search(x[:5], 10).ids == ref.search(x[:5], 10).ids).all())   # exact
    True
    """

    metrics = ("ip",)
    capabilities = Capabilities(search_params=frozenset({"max_items"}))

    def __init__(self, dim: int, metric: str = "ip"):
        super().__init__(dim, metric)
        self._x = np.empty((0, dim), np.float32)
        self._ids = np.empty(0, np.int64)
        self._norms = np.empty(0, np.float32)
        self._tail = _Tail(dim)

    def _store(self, x: np.ndarray, ids: np.ndarray) -> None:
        norms = np.linalg.norm(x, axis=1).astype(np.float32)
        order = np.lexsort((ids, -norms))  # largest norm first; equal norms by id
        self._x = np.ascontiguousarray(x[order])
        self._ids = ids[order]
        self._norms = norms[order]
        self._tail.clear()

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        self._tail.append(x, ids)
        if self._tail.full(self._ids.size):
            tx, tids = self._tail.view()[:2]
            self._store(np.concatenate([self._x, tx]), np.concatenate([self._ids, tids]))

    def _remove(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self._ids, ids)
        if not keep.all():
            self._x, self._ids, self._norms = self._x[keep], self._ids[keep], self._norms[keep]
        self._tail.keep(~np.isin(self._tail.view()[1], ids))

    def _all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x, ids, norms): the sorted items, then the tail (for filters and saving; the
        concatenation is kept until the next write)."""
        return _joined(self, (self._x, self._ids, self._norms))

    def _search(self, q: np.ndarray, k: int, max_items: int | None = None) -> SearchResult:
        return self._scan(q, k, max_items)[0]

    def memory_bytes(self) -> int:
        """Bytes held: the vectors in norm order, their ids and norms, and the tail."""
        return int(self._x.nbytes + self._ids.nbytes + self._norms.nbytes + self._tail.nbytes())

    # filtered search: allowed rows gathered in norm order keep the stop (docs/filters.md)
    def _exact_under(self, params: dict) -> bool:
        return params.get("max_items") is None

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        x, ids, _ = self._all()
        return ids, x

    def _traversal_reads(self, k: int, params: dict) -> float:
        return float(min(len(self), params["max_items"] + self._tail.n))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        n = len(self)
        return min(n, int(np.ceil(2 * k * w))), {
            "max_items": min(n, int(np.ceil(params["max_items"] * w)))}

    def _exact_allowed(self, q: np.ndarray, k: int, ids: np.ndarray) -> tuple:
        x, all_ids, norms = self._all()
        pos = self._positions_of(ids)
        pos = pos[np.lexsort((all_ids[pos], -norms[pos]))]  # norm order
        r = self._scan(q, min(k, ids.size), None, (x[pos], all_ids[pos], norms[pos]))[0]
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
        n = self._ids.size  # positions past the sorted items are the tail's
        hide = np.zeros((len(q), self._tail.n), bool)
        tail = skip[1] >= n
        hide[skip[0][tail], skip[1][tail] - n] = True
        skip = (skip[0][~tail], skip[1][~tail])
        order = np.argsort(skip[1], kind="stable")
        r = self._scan(q, k, None, skip=(skip[0][order], skip[1][order]), hide=hide)[0]
        return r.ids, r.scores

    def _scan(self, q: np.ndarray, k: int, max_items: int | None, rows: tuple | None = None,
              skip: tuple | None = None, hide: np.ndarray | None = None):
        """(result, items scanned per query), over ``rows`` = (x, ids, norms) in norm order
        (default: every item: the tail, scored in full first, then the sorted items up to
        ``max_items``), leaving out the (query, position) pairs ``skip`` (sorted by position)
        and the (query, tail row) pairs ``hide``."""
        x, ids, norms = rows if rows is not None else (self._x, self._ids, self._norms)
        n = x.shape[0]
        budget = n if max_items is None else min(check_int("max_items", max_items, 1), n)
        nq = q.shape[0]
        heap_s = np.full((nq, k), -np.inf, np.float32)
        heap_i = np.full((nq, k), -1, np.int64)
        sizes = np.zeros(nq, np.int64)
        scanned = np.zeros(nq, np.int64)
        qn = np.linalg.norm(q, axis=1).astype(np.float32)
        if rows is None and self._tail.n:  # its k-th best can only stop the scan sooner
            _push_tail(q, self._tail, heap_s, heap_i, sizes, hide)
            scanned += self._tail.n
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
            scanned[active] = end + (self._tail.n if rows is None else 0)
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

    # the tail is saved as it is, so a loaded index scores exactly as the saved one
    def _get_state(self):
        tx, tids = self._tail.view()[:2]
        return {}, {"x": self._x, "ids": self._ids, "tail_x": tx, "tail_ids": tids}

    def _set_state(self, meta, arrays):
        x, ids = np.array(arrays["x"], np.float32), np.array(arrays["ids"], np.int64)
        tx, tids = (x[:0], ids[:0]) if "tail_ids" not in arrays else \
            (np.array(arrays["tail_x"], np.float32), np.array(arrays["tail_ids"], np.int64))
        check_restored(self._idset.sorted, np.concatenate([ids, tids]),
                       np.concatenate([x, tx]) if x.ndim == tx.ndim == 2 else x, self.dim)
        self._store(x, ids)
        if "tail_ids" in arrays:
            self._tail.append(np.array(arrays["tail_x"], np.float32), arrays["tail_ids"])


@register("norm-ivf")
class NormIVFIndex(FilterPlanner, Index):
    """MIPS over inverted lists of directions, each scanned by decreasing norm with the
    Cauchy–Schwarz stop (metric "ip" only; train first).

    Build: ``n_lists`` (default: the square root of the training rows), ``seed``. Search:
    ``n_probe`` lists per query (default all: then the answer is exact, as FlatIndex's up to
    float rounding), ``n_threads`` (1; -1 for all cores: a batch's queries spread over numba
    threads). Within the visited lists the answer is exact; recall grows with n_probe.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.NormIVFIndex(16, n_lists=8)
    >>> idx.train(x)
    >>> _ = idx.add(x)
    >>> idx.search(x[:2], k=3, n_probe=8).ids.shape   # every list probed: exact
    (2, 3)
    """

    metrics = ("ip",)
    capabilities = Capabilities(search_params=frozenset({"n_probe", "n_threads"}),
                                needs_training=True)

    def __init__(self, dim: int, metric: str = "ip", n_lists: int | None = None, seed: int = 0):
        if n_lists is not None:
            check_int("n_lists", n_lists, 1, 1 << 20)
        check_int("seed", seed, 0, 2**31 - 1)
        super().__init__(dim, metric, n_lists=n_lists, seed=seed)
        self._centroids = np.empty((0, dim), np.float32)
        self._tail = _Tail(dim)
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
        self._tail.clear()

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        lists = assign(x, self._centroids)
        self._tail.append(x, ids, lists)
        # the lists' ranking bound covers the tail's items too
        np.maximum.at(self._list_norm, lists, self._tail.view()[2][-len(ids):])
        if self._tail.full(self._ids.size):
            tx, tids, _, tl = self._tail.view()
            self._store(np.concatenate([self._x, tx]), np.concatenate([self._ids, tids]),
                        np.concatenate([self._lists, tl]))

    def _remove(self, ids: np.ndarray) -> None:
        keep = ~np.isin(self._ids, ids)
        tail_keep = ~np.isin(self._tail.view()[1], ids)
        if not keep.all():
            tx, tids, _, tl = self._tail.view()
            self._store(np.concatenate([self._x[keep], tx[tail_keep]]),
                        np.concatenate([self._ids[keep], tids[tail_keep]]),
                        np.concatenate([self._lists[keep], tl[tail_keep]]))
        else:
            self._tail.keep(tail_keep)

    def _all(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(x, ids, norms, lists): the sorted items, then the tail (kept until the next
        write)."""
        return _joined(self, (self._x, self._ids, self._norms, self._lists))

    def _search(self, q: np.ndarray, k: int, n_probe: int | None = None,
                n_threads: int = 1) -> SearchResult:
        return self._scan(q, k, n_probe, n_threads)[0]

    def memory_bytes(self) -> int:
        """Bytes held: the vectors by list and norm, their ids, norms and lists, the centroids
        and the tail."""
        own = (self._x, self._ids, self._norms, self._lists, self._offsets, self._list_norm,
               self._centroids)
        return int(sum(a.nbytes for a in own) + self._tail.nbytes())

    def _filtered_traversal(self, q, k, filt, params, w):
        """A filter shared by the batch is skipped inside the lists (a mask per position), and
        w times the lists are visited: as many allowed items as the unfiltered search scores.
        (With the lists unwidened, recall@10 fell to 0.86 at 50% and 0.64 at 10% selectivity
        on synthetic-longtail 200k where it was 0.91 without a filter; docs/filters.md.)"""
        if not filt.shared:
            return None
        params = self._widen(k, w, params)[1]
        allowed = np.zeros(len(self), np.uint8) if filt.allow is not None \
            else np.ones(len(self), np.uint8)
        for ids, v in ((filt.allow, 1), (filt.deny, 0)):
            if ids is not None and ids.size:
                allowed[self._positions_of(ids[self._idset.contains(ids)])] = v
        r = self._scan(q, k, params.get("n_probe"), params.get("n_threads", 1), allowed)[0]
        return r.ids, r.scores  # (positions past the sorted items are the tail's)

    # filtered search (docs/filters.md): every list visited is exact; fewer lists are widened
    def _exact_under(self, params: dict) -> bool:
        n_probe = params.get("n_probe")
        return n_probe is None or n_probe >= self.n_lists

    def _stored(self) -> tuple[np.ndarray, np.ndarray]:
        x, ids = self._all()[:2]
        return ids, x

    def _traversal_reads(self, k: int, params: dict) -> float:
        return len(self) * min(1.0, params["n_probe"] / max(self.n_lists, 1))

    def _widen(self, k: int, w: float, params: dict) -> tuple[int, dict]:
        kk = min(len(self), int(np.ceil(2 * k * w)))
        if params.get("n_probe") is None:
            return kk, params
        return kk, {**params, "n_probe": min(self.n_lists, int(np.ceil(params["n_probe"] * w)))}

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
        probes = rank(q, self._centroids, self._list_norm, min(n_probe, self.n_lists))
        qn = np.linalg.norm(q, axis=1).astype(np.float32)
        n = self._ids.size
        main_allowed = allowed[:n] if allowed.shape[0] else allowed
        ids, scores, scored = kernel(q, qn, self._x, self._norms, self._ids, self._offsets,
                                     probes, k, main_allowed)
        if self._tail.n:  # the tail's rows in each query's visited lists, all scored
            t_lists = self._tail.view()[3]
            visited = np.zeros((q.shape[0], self.n_lists), bool)
            np.put_along_axis(visited, probes, True, 1)
            hide = ~visited[:, t_lists]
            if allowed.shape[0]:
                hide |= ~allowed[n:].astype(bool)[None, :]
            sizes = (ids >= 0).sum(1)  # the kernel's rows are heaps' sorted contents
            heap_s, heap_i = _as_heaps(scores, ids, sizes)
            _push_tail(q, self._tail, heap_s, heap_i, sizes, hide)
            heap_finish(heap_s, heap_i, sizes)
            ids, scores = heap_i, heap_s
            scored = scored + (~hide).sum(1)
        return SearchResult(ids, scores), scored

    def _get_state(self):
        tx, tids, _, tl = self._tail.view()
        return {}, {"x": self._x, "ids": self._ids, "lists": self._lists,
                    "centroids": self._centroids, "tail_x": tx, "tail_ids": tids,
                    "tail_lists": tl}

    def _set_state(self, meta, arrays):
        self._centroids = np.array(arrays["centroids"], np.float32)
        x, ids = np.array(arrays["x"], np.float32), np.array(arrays["ids"], np.int64)
        lists = np.array(arrays["lists"], np.int64)
        tx, tids, tl = (np.array(arrays["tail_x"], np.float32),
                        np.array(arrays["tail_ids"], np.int64),
                        np.array(arrays["tail_lists"], np.int64)) if "tail_ids" in arrays \
            else (x[:0], ids[:0], lists[:0])
        check_restored(self._idset.sorted, np.concatenate([ids, tids]),
                       np.concatenate([x, tx]) if x.ndim == tx.ndim == 2 else x, self.dim)
        every = np.concatenate([lists, tl])
        if self._centroids.shape != (self.n_lists, self.dim) or every.shape != (len(self),) or \
                (every.size and (every.min() < 0 or every.max() >= self.n_lists)):
            raise ValueError("stored lists do not match the index's inverted lists")
        self._store(np.array(arrays["x"], np.float32), np.array(arrays["ids"], np.int64),
                    np.array(arrays["lists"], np.int64))
        if "tail_ids" in arrays:
            tx, tl = np.array(arrays["tail_x"], np.float32), arrays["tail_lists"]
            self._tail.append(tx, arrays["tail_ids"], tl)
            np.maximum.at(self._list_norm, tl, np.linalg.norm(tx, axis=1).astype(np.float32))

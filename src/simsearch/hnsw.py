"""HNSW over hnswlib. With metric "ip" this is ip-NSW, the graph baseline for MIPS."""

from __future__ import annotations

import threading
from typing import Any

import hnswlib
import numpy as np

from ._hnswlib import (
    hnswlib_from_saved,
    hnswlib_from_state,
    hnswlib_graph,
    hnswlib_in_walk_order,
    hnswlib_state,
    relayout,
)
from ._numba_util import kernel_width
from .capabilities import Capabilities
from .errors import InvalidParameterError
from .index import (
    Index,
    SearchResult,
    check_int,
    check_threads,
    pad_score,
    register,
)
from .planner import BeamFilterHooks, FilterPlanner

_SPACES = {"ip": "ip", "cosine": "cosine", "l2": "l2"}
# smaller graphs keep insertion order: hnswlib prefetches each neighbour's row, so the order
# gained 1.01-1.03x at 400k items, 1.06-1.18x at 1M (docs/benchmarks.md, "HNSW in walk order")
REORDER_MIN = 1 << 19


class _EfGate:
    """hnswlib keeps ef on the index, so a search must not run while another one changes it.
    Searches with the same ef run concurrently; a different ef waits until the index is idle."""

    def __init__(self, index: hnswlib.Index):
        self._index = index
        self._cond = threading.Condition(threading.Lock())
        self._active = 0
        self._waiting = 0
        self._ef = -1

    def enter(self, ef: int) -> None:
        with self._cond:
            while self._active and self._ef != ef:
                self._waiting += 1
                self._cond.wait()
                self._waiting -= 1
            if self._ef != ef:
                self._index.set_ef(ef)
                self._ef = ef
            self._active += 1

    def exit(self) -> None:
        with self._cond:
            self._active -= 1
            if not self._active and self._waiting:
                self._cond.notify_all()


def _byte_table(top: int, allow=None, deny=None) -> bytearray:
    """One byte per id 0..top, 1 where allowed: hnswlib calls ``table[label]`` on each
    candidate, a C call."""
    t = bytearray(b"\x01") * (top + 1) if allow is None else bytearray(top + 1)
    view = np.frombuffer(t, np.uint8)
    if allow is not None:
        view[allow[allow <= top]] = 1
    if deny is not None and deny.size:
        view[deny[deny <= top]] = 0
    return t


@register("hnsw")
class HNSWIndex(BeamFilterHooks, FilterPlanner, Index):
    """Hierarchical navigable small world graph (hnswlib).

    Parameters
    ----------
    dim, metric : "ip" (ip-NSW), "cosine" or "l2".
    M : links per node (the paper's M); level 0 keeps 2M.
    ef_construction : beam width while building.
    capacity : initial number of slots; grows on demand (doubling).
    seed : hnswlib's level-assignment seed.
    n_threads : threads used by add(); searches take ``n_threads`` per call.
    reorder : lay the nodes out in walk order (:meth:`reorder`) whenever an add has doubled the
        index since the last time (from 524,288 items); answers unchanged (docs/benchmarks.md,
        "HNSW in walk order").

    Search parameters: ``ef`` (beam width, default max(k, 64); raised to k when smaller) and
    ``n_threads`` (default 1: per-query paths and servers run single-threaded; pass -1 for all
    cores on large batches). remove() marks items deleted (hnswlib deletion marks) and later adds
    take over their slots, so memory follows the live item count, not the number of adds ever
    made (docs/bench/service.md, "Soak"); a removed id may be added again.

    >>> import numpy as np, simsearch as ss
    >>> x = np.random.default_rng(0).standard_normal((1000, 16)).astype("float32")
    >>> idx = ss.HNSWIndex(16, "l2", M=16, ef_construction=100)
    >>> ids = idx.add(x)
    >>> idx.search(x[:3], k=1, ef=64).ids.tolist()
    [[0], [1], [2]]
    """

    capabilities = Capabilities(search_params=frozenset({"ef", "n_threads"}))

    def __init__(
        self,
        dim: int,
        metric: str = "l2",
        M: int = 16,
        ef_construction: int = 200,
        capacity: int = 1024,
        seed: int = 100,
        n_threads: int = -1,
        reorder: bool = True,
    ):
        M = check_int("M", M, 2, 1024)
        if not isinstance(reorder, bool):
            raise InvalidParameterError(f"reorder must be a bool; got {reorder!r}")
        ef_construction = check_int("ef_construction", ef_construction, 1, 1 << 20)
        capacity = check_int("capacity", capacity, 1)
        seed = check_int("seed", seed, 0)
        super().__init__(
            dim,
            metric,
            M=M,
            ef_construction=ef_construction,
            capacity=capacity,
            seed=seed,
            n_threads=n_threads,
            reorder=reorder,
        )
        self._hnsw = hnswlib.Index(space=_SPACES[self.metric], dim=self.dim)
        self._hnsw.init_index(
            max_elements=capacity, M=M, ef_construction=ef_construction, random_seed=seed,
            allow_replace_deleted=True,
        )
        self._gate = _EfGate(self._hnsw)
        self._deleted = 0  # slots marked deleted and not yet taken over
        self._items: tuple | None = None  # (version, labels sorted, order, vectors): filters
        self._laid_out = 0  # nodes at the last reorder

    def _add(self, x: np.ndarray, ids: np.ndarray) -> None:
        fresh = np.ones(ids.size, bool)
        if self._deleted:
            # an id removed earlier may still hold its (deleted) slot: bring it back in place.
            # (hnswlib loses track of a label re-added with replace_deleted, so not that way)
            for r, label in enumerate(ids.tolist()):
                try:
                    self._hnsw.unmark_deleted(label)
                except RuntimeError:  # not there: its slot was taken over, or it never was
                    continue
                self._deleted -= 1
                fresh[r] = False
            if not fresh.all():
                self._hnsw.add_items(x[~fresh], ids[~fresh], num_threads=1)  # an update
                x, ids = x[fresh], ids[fresh]
        if not ids.size:
            return
        reuse = min(self._deleted, ids.size)  # deleted slots the new items take over
        need = self._hnsw.element_count + ids.size - reuse
        cap = self._hnsw.max_elements
        if need > cap:
            self._hnsw.resize_index(max(need, 2 * cap))
        self._hnsw.add_items(x, ids, num_threads=self._params["n_threads"], replace_deleted=True)
        self._deleted -= reuse
        n = self._hnsw.element_count
        if self._params["reorder"] and n >= max(REORDER_MIN, 2 * self._laid_out):
            relayout(self._reorder, n)

    def reorder(self) -> None:
        """Renumber the nodes in breadth-first order of the bottom layer from the entry point,
        so a search's neighbours sit near each other in memory (docs/benchmarks.md, "HNSW in
        walk order"). Labels and answers stay. ``add`` does it by itself each time the index
        has doubled (``reorder=True``). A write: searches wait; it holds a second copy of the
        graph while it runs."""
        with self._lock.write():
            self._reorder()
            self._version += 1

    def _reorder(self) -> None:
        n = self._hnsw.element_count
        if n > 1:
            h = hnswlib_in_walk_order(self._hnsw)
            self._hnsw, self._gate = h, _EfGate(h)
        self._laid_out = n

    def _remove(self, ids: np.ndarray) -> None:
        for label in ids.tolist():
            self._hnsw.mark_deleted(label)
        self._deleted += ids.size

    def _search(
        self, q: np.ndarray, k: int, ef: int | None = None, n_threads: int = 1
    ) -> SearchResult:
        ef = max(k, 64) if ef is None else max(check_int("ef", ef, 1, 1 << 20), k)
        # a beam wider than the graph finds nothing more (removed nodes are in the graph)
        ef = min(ef, max(self._hnsw.element_count, k))
        n_threads = kernel_width(check_threads(n_threads))  # capped by the process's width
        kk = min(k, len(self))
        self._gate.enter(ef)
        try:
            labels, dist = self._hnsw.knn_query(q, k=kk, num_threads=n_threads)
        except RuntimeError:
            # hnswlib raises when it finds fewer than k live items (many deletions); retry
            # one query at a time with a shrinking k and pad.
            return self._search_padded(q, k, kk, n_threads)
        finally:
            self._gate.exit()
        return self._to_result(labels, dist, k)

    # filtered search (docs/filters.md): hnswlib's own filtered search (its beam keeps ef
    # allowed items and walks through the others) with a byte table as the filter, else the
    # beam widened by 1/selectivity
    filter_read_cost = 32.0  # measured: docs/filters.md, "The planner"

    def _filtered_traversal(self, q, k, filt, params, w):
        top = int(self._idset.sorted[-1])
        if top > 4 * len(self) + (1 << 20):  # sparse ids: a table would be too large
            return None

        ef = params.get("ef")
        ef = max(k, 64) if ef is None else max(check_int("ef", ef, 1, 1 << 20), k)
        n_threads = kernel_width(check_threads(params.get("n_threads", 1)))
        ids = np.full((q.shape[0], k), -1, np.int64)
        scores = np.full((q.shape[0], k), pad_score(self.metric), np.float32)
        self._gate.enter(ef)
        try:
            if filt.shared:
                table = _byte_table(top, filt.allow, filt.deny)
                self._knn_filtered(q, k, table, n_threads, ids, scores, np.arange(q.shape[0]))
            else:  # one table, changed for each query's lists and changed back
                per_allow = isinstance(filt.allow, list)
                table = _byte_table(top, np.empty(0, np.int64) if per_allow else filt.allow)
                view = np.frombuffer(table, np.uint8)
                for i in range(q.shape[0]):
                    a, d = filt.allow_of(i), filt.deny_of(i)
                    a = a[a <= top] if per_allow else None
                    d = d[d <= top] if d is not None else None
                    if a is not None:
                        view[a] = 1
                    kept = None
                    if d is not None:
                        kept = view[d].copy()
                        view[d] = 0
                    self._knn_filtered(q[i : i + 1], k, table, 1, ids, scores, [i])
                    if kept is not None:
                        view[d] = kept
                    if a is not None:
                        view[a] = 0
        finally:
            self._gate.exit()
        return ids, scores

    def _knn_filtered(self, q, k, table, n_threads, ids, scores, rows) -> None:
        """hnswlib's filtered search into rows of (ids, scores); a query that finds fewer
        than k allowed items (hnswlib then refuses) stays padded: the planner scans it."""
        try:
            lab, dist = self._hnsw.knn_query(q, k=k, num_threads=n_threads,
                                             filter=table.__getitem__)
        except RuntimeError:
            if len(rows) > 1:
                for j, r in enumerate(rows):
                    self._knn_filtered(q[j : j + 1], k, table, 1, ids, scores, [r])
            return
        r = self._to_result(lab, dist, k)
        ids[rows], scores[rows] = r.ids, r.scores

    def graph(self) -> dict[str, Any]:
        """The graph in label space (labels must be 0..n-1): see hnswlib_graph."""
        return hnswlib_graph(self._hnsw)

    def _vectors_of(self, ids: np.ndarray) -> np.ndarray:
        cache = self._items
        if cache is None or cache[0] != self._version:
            if ids.size * 20 < len(self):  # get_items: ~6 us an item; the copy: ~0.3 us one
                return np.asarray(self._hnsw.get_items(ids, return_type="numpy"), np.float32)
            st = self._hnsw.__getstate__()[0]
            n, spe = int(st["cur_element_count"]), int(st["size_data_per_element"])
            raw = st["data_level0"].view(np.uint8)[: n * spe].reshape(n, spe)
            od, lo = int(st["offset_data"]), int(st["label_offset"])
            x = np.ascontiguousarray(raw[:, od : od + 4 * self.dim]).view(np.float32)
            labels = np.ascontiguousarray(raw[:, lo : lo + 8]).view(np.int64)[:, 0]
            order = np.argsort(labels, kind="stable")
            cache = self._items = (self._version, labels[order], order, x)
        return cache[3][cache[2][np.searchsorted(cache[1], ids)]]

    def _search_padded(self, q, k, kk, n_threads) -> SearchResult:
        ids = np.full((q.shape[0], k), -1, np.int64)
        scores = np.full((q.shape[0], k), np.inf if self.metric == "l2" else -np.inf, np.float32)
        for i in range(q.shape[0]):
            for kq in range(kk, 0, -1):
                try:
                    lab, d = self._hnsw.knn_query(q[i : i + 1], k=kq, num_threads=1)
                except RuntimeError:
                    continue
                r = self._to_result(lab, d, k)
                ids[i], scores[i] = r.ids[0], r.scores[0]
                break
        return SearchResult(ids, scores)

    def _to_result(self, labels: np.ndarray, dist: np.ndarray, k: int) -> SearchResult:
        nq, kk = labels.shape
        if kk == k:  # the common case: no padding; labels are uint64 ids < 2**63
            return SearchResult(labels.view(np.int64), dist if self.metric == "l2" else 1.0 - dist)
        ids = np.full((nq, k), -1, np.int64)
        ids[:, :kk] = labels.astype(np.int64)
        if self.metric == "l2":
            scores = np.full((nq, k), np.inf, np.float32)
            scores[:, :kk] = dist
        else:  # hnswlib returns 1 - similarity
            scores = np.full((nq, k), -np.inf, np.float32)
            scores[:, :kk] = 1.0 - dist
        return SearchResult(ids, scores)

    def _get_state(self):
        hmeta, harrays = hnswlib_state(self._hnsw)
        return {"deleted": self._deleted, "hnswlib": hmeta}, {
            f"hnswlib.{k}": v for k, v in harrays.items()}

    def _set_state(self, meta, arrays):
        if "hnswlib" in arrays:  # a file from before hnswlib's state was kept as arrays
            self._hnsw = hnswlib_from_saved(arrays["hnswlib"], _SPACES[self.metric], self.dim,
                                            int(meta["capacity"]), allow_replace_deleted=True)
        else:
            h = hnswlib_from_state(meta["hnswlib"], {k[8:]: v for k, v in arrays.items()
                                                     if k.startswith("hnswlib.")})
            if h.space != _SPACES[self.metric] or h.dim != self.dim:
                raise ValueError("the hnswlib state does not match the index's metric or dim")
            self._hnsw = h
        self._gate = _EfGate(self._hnsw)
        self._laid_out = self._hnsw.element_count
        # files written before slots were reused list their removed labels instead of a count
        self._deleted = int(meta.get("deleted", len(arrays.get("removed", ()))))

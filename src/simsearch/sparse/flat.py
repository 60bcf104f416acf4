"""The store every sparse kind keeps (SparseStore), and SparseFlatIndex: exact maximum inner
product search over sparse items by an inverted-index scan (docs/sparse.md), the oracle every
sparse test checks against and the "linscan" baseline of the big-ann sparse track."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._grow import Grow
from ..capabilities import Capabilities
from ..errors import InvalidParameterError
from ..filters import IdFilter
from ..index import Index, SearchResult, check_restored, register
from ._kernels import NO_BM25, NO_LENGTHS, inverted_scan
from .batch import SparseBatch, sparse_batch

#: rows added since the posting lists were built are scanned row by row; past this share of
#: the listed rows (or 4,096 rows) the lists are rebuilt, so an add costs O(nnz) amortised
TAIL_SHARE = 0.125
TAIL_MIN = 4096


class _Rows:
    """An array attribute kept in a Grow (appends amortized O(added)): reading it gives the
    filled view, assigning it replaces the contents."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.slot = "_grown" + name

    def __get__(self, obj: Any, owner: Any = None) -> Any:
        return self if obj is None else getattr(obj, self.slot).view()

    def __set__(self, obj: Any, value: np.ndarray) -> None:
        setattr(obj, self.slot, Grow(value.dtype, value))

    def grow(self, obj: Any) -> Grow:
        return getattr(obj, self.slot)


def row_sums(x: SparseBatch) -> np.ndarray:
    """Each row's total weight, float32."""
    rows = np.repeat(np.arange(len(x)), np.diff(x.indptr))
    return np.bincount(rows, weights=x.values, minlength=len(x)).astype(np.float32)


class SparseStore(Index):
    """What every sparse kind keeps: the rows by position (CSR), their ids, which are alive, and
    posting lists over the first ``n_main`` positions (the rest, the tail, scanned row by row);
    writes, filters and persistence. A kind gives ``_scan(q, k, ok)``: the exact top-k among
    the positions ``ok`` allows."""

    metrics = ("ip",)
    capabilities = Capabilities(items="sparse")
    # by position: the rows (CSR), their ids, alive or removed, their total weight (BM25: the
    # item's length)
    _fp, _fi, _fv, _pos_ids, _alive, _rowsum = (_Rows() for _ in range(6))

    def __init__(self, dim: int, metric: str = "ip", **params: Any):
        """``params``: the kind's build parameters (saved); among them ``nonnegative`` (default
        True) refuses negative weights, and ``rebuild_after`` (default ``TAIL_MIN``) is how many
        rows the tail holds before the lists are rebuilt."""
        nonnegative = params.get("nonnegative", True)
        if not isinstance(nonnegative, bool):
            raise InvalidParameterError(f"nonnegative must be true or false; got {nonnegative!r}")
        super().__init__(dim, metric, **params)
        self.nonnegative = nonnegative
        self._clear()

    def _clear(self) -> None:
        self._fp = np.zeros(1, np.int64)  # forward rows by position (CSR)
        self._fi = np.empty(0, np.uint32)
        self._fv = np.empty(0, np.float32)
        self._pos_ids = np.empty(0, np.int64)
        self._alive = np.empty(0, bool)
        self._rowsum = np.empty(0, np.float32)
        self._dead = 0
        self._build_lists(0)

    # -- items ------------------------------------------------------------------------------

    def check_items(self, x: Any, what: str = "items") -> SparseBatch:
        return sparse_batch(x, self.dim, what, nonnegative=self.nonnegative)

    def item_bytes(self, x: SparseBatch) -> bytes:
        return x.to_bytes()

    def items_from_bytes(self, blob: bytes) -> SparseBatch:
        return self.check_items(SparseBatch.from_bytes(blob, self.dim))

    # -- writes -----------------------------------------------------------------------------

    def _add(self, x: SparseBatch, ids: np.ndarray) -> None:
        cls = type(self)
        cls._fp.grow(self).append(self._fp[-1] + x.indptr[1:] - x.indptr[0])
        cls._fi.grow(self).append(x.indices)
        cls._fv.grow(self).append(x.values)
        cls._pos_ids.grow(self).append(ids)
        cls._alive.grow(self).append(np.ones(len(x), bool))
        cls._rowsum.grow(self).append(row_sums(x))
        self._maybe_compact()

    def _remove(self, ids: np.ndarray) -> None:
        self._alive[self._positions(ids)] = False
        self._dead += ids.size
        self._maybe_compact()

    def _positions(self, ids: np.ndarray) -> np.ndarray:
        live = np.flatnonzero(self._alive)
        order = np.argsort(self._pos_ids[live], kind="stable")
        srt = self._pos_ids[live][order]
        return live[order[np.searchsorted(srt, ids)]]

    def _maybe_compact(self) -> None:
        n = self._pos_ids.size
        if self._dead * 4 > n:  # drop the dead rows, renumber the positions
            keep = np.flatnonzero(self._alive)
            rows = self._rows(keep)
            self._fp, self._fi, self._fv = rows.indptr, rows.indices, rows.values
            self._pos_ids, self._alive, self._dead = self._pos_ids[keep], self._alive[keep], 0
            self._rowsum = self._rowsum[keep]
            self._build_lists(keep.size)
        elif n - self._n_main > max(self._params.get("rebuild_after", TAIL_MIN),
                                    TAIL_SHARE * self._n_main):
            self._build_lists(n)

    def _rows(self, positions: np.ndarray) -> SparseBatch:
        return SparseBatch(self._fp, self._fi, self._fv, self.dim)[positions]

    def _build_lists(self, n_main: int) -> None:
        """Posting lists (CSC: the positions holding each term, with their weights) of the
        first ``n_main`` positions; later positions form the tail, scanned row by row."""
        self._post = SparseBatch(self._fp[: n_main + 1], self._fi, self._fv, self.dim).columns()
        self._n_main = n_main

    def memory_bytes(self) -> int:
        """Bytes held: the rows, their ids, liveness and weights, and the posting lists."""
        return int(sum(a.nbytes for a in (self._fp, self._fi, self._fv, self._pos_ids,
                                          self._alive, self._rowsum, *self._post)))

    # -- search -----------------------------------------------------------------------------

    def _scan(self, q: SparseBatch, k: int, ok: np.ndarray, **params: Any) -> SearchResult:
        """The kind's top-k among the positions ``ok`` allows."""
        raise NotImplementedError

    def _scan_filtered(self, q: SparseBatch, k: int, ok: np.ndarray,
                       **params: Any) -> SearchResult:
        """``_scan`` under a filter (a kind whose search needs enough allowed items to find
        them overrides it)."""
        return self._scan(q, k, ok, **params)

    def _exact(self, q: SparseBatch, k: int, ok: np.ndarray, lengths: np.ndarray = NO_LENGTHS,
               bm25: tuple = NO_BM25) -> SearchResult:
        """The exact top-k among the positions ``ok`` allows (the inverted scan; with
        ``lengths``, BM25: ``_kernels.inverted_scan``)."""
        pp, pi, pv = self._post
        ids, scores = inverted_scan(q.indptr, q.indices, q.values, pp, pi, pv, self._n_main,
                                    self._fp, self._fi, self._fv, self._pos_ids, ok, k,
                                    lengths, bm25)
        return SearchResult(ids, scores)

    def _search(self, q: SparseBatch, k: int, **params: Any) -> SearchResult:
        return self._scan(q, k, self._alive, **params)

    def _search_filtered(self, q: SparseBatch, k: int, filt: IdFilter,
                         **params: Any) -> SearchResult:
        """The scan skipping the positions the filter leaves out: once for a filter the batch
        shares, else query by query."""
        out_i = np.full((len(q), k), -1, np.int64)
        out_s = np.full((len(q), k), -np.inf, np.float32)
        for i in [0] if filt.shared else range(len(q)):
            rows = np.arange(len(q)) if filt.shared else np.array([i])
            ok = self._alive & filt.allowed(self._pos_ids, None if filt.shared else i)
            r = self._scan_filtered(q[rows], k, ok, **params)
            out_i[rows], out_s[rows] = r.ids, r.scores
        return SearchResult(out_i, out_s)

    def _vectors_of(self, ids: np.ndarray) -> SparseBatch:
        return self._rows(self._positions(ids))

    # -- persistence ------------------------------------------------------------------------

    def _get_state(self) -> tuple[dict, dict[str, np.ndarray]]:
        """Every position (removed ones too) and where the lists end: a load builds the same
        lists from the same rows, so it answers exactly as the saved index did."""
        return {"n_main": int(self._n_main)}, {
            "ids": self._pos_ids, "alive": self._alive.astype(np.uint8), "indptr": self._fp,
            "indices": self._fi, "values": self._fv}

    def _set_state(self, meta: dict, arrays: dict[str, np.ndarray]) -> None:
        ids, alive, ip = arrays["ids"], arrays["alive"], arrays["indptr"]
        n, n_main = ids.size, meta.get("n_main")
        if ids.dtype != np.int64 or ids.ndim != 1 or alive.shape != (n,) or \
                alive.dtype != np.uint8 or (alive > 1).any() or ip.dtype != np.int64 or \
                ip.shape != (n + 1,) or ip[0] != 0 or (np.diff(ip) < 0).any() or \
                ip[-1] != arrays["indices"].size or not isinstance(n_main, int) or \
                not 0 <= n_main <= n:
            raise ValueError("the stored rows' offsets, ids or lists' end do not match")
        alive = alive.astype(bool)
        check_restored(self._idset.sorted, ids[alive])
        rows = sparse_batch(SparseBatch(ip, arrays["indices"], arrays["values"], self.dim),
                            self.dim, "stored items", nonnegative=self.nonnegative)
        self._fp, self._fi, self._fv = rows.indptr, rows.indices.copy(), rows.values.copy()
        self._pos_ids, self._alive = ids.copy(), alive
        self._dead = int(n - alive.sum())
        self._rowsum = row_sums(rows)
        self._build_lists(n_main)


@register("sparse-flat")
class SparseFlatIndex(SparseStore):
    """Exact sparse MIPS: the top-k items by inner product among those sharing a term with the
    query (an item sharing none scores 0 and is not returned: results are padded with -1).

    ``dim`` is the vocabulary size (term ids in ``[0, dim)``, up to 2^32 - 1); metric "ip". Items
    and queries are sparse batches (``simsearch.sparse.sparse_batch``): a scipy.sparse matrix,
    a ``SparseBatch`` or ``(indices, values)`` pairs. ``nonnegative`` (default True): refuse
    negative weights (SPLADE and BM25 have none); False allows them. Supports remove();
    searches may run concurrently; writes are serialized.

    >>> import scipy.sparse as sp, simsearch as ss
    >>> idx = ss.SparseFlatIndex(10)
    >>> idx.add([([1, 4], [0.5, 2.0]), ([4, 7], [1.0, 1.0]), ([2], [3.0])]).tolist()
    [0, 1, 2]
    >>> r = idx.search(([4], [1.0]), k=3)    # one query: term 4
    >>> r.ids.tolist(), r.scores.tolist()   # item 2 shares no term: padding
    ([[0, 1, -1]], [[2.0, 1.0, -inf]])
    """

    def __init__(self, dim: int, metric: str = "ip", nonnegative: bool = True):
        super().__init__(dim, metric, nonnegative=nonnegative)

    def _scan(self, q: SparseBatch, k: int, ok: np.ndarray) -> SearchResult:
        return self._exact(q, k, ok)
